#!/usr/bin/env bash
# Fuzzes ddp's two file parsers (the IDX reader and the checkpoint decoder) with libFuzzer: builds each target of
# test/fuzz with clang++-14 -fsanitize=fuzzer,address,undefined, runs it for SECONDS from the seed corpus
# (test/fuzz/corpus/<target>), and prints executions, coverage (libFuzzer's cov: edges, ft: features) and crashes.
# Every crashing input is copied to test/fuzz/regressions/<target>/ (commit it: //test/fuzz:regressions_test
# replays it with gcc). After a crash the target is restarted for the time left (at most 5 restarts).
#
# usage: tools/fuzz.sh [SECONDS per target, default 60] [TARGET...]   (targets: idx checkpoint)
# env:   CXX (default clang++-14), FUZZ_OUT (work dir, default /tmp/ddp-fuzz), FUZZ_REGRESSIONS (where crashing
#        inputs are copied, default test/fuzz/regressions; //test/fuzz:*_fuzz_test points it outside the tree)
# exit:  0 when no target crashed, 1 when one did (its inputs are kept), 2 on bad usage or a failed build.
# needs: clang-14 and libfuzzer-14-dev (tools/setup.sh installs both)
set -euo pipefail

secs="${1:-60}"
shift || true
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(idx checkpoint)
[[ "$secs" =~ ^[0-9]+$ ]] && [ "$secs" -gt 0 ] || { echo "fuzz.sh: SECONDS must be a positive integer, got '$secs'" >&2; exit 2; }

root="$(cd "$(dirname "$0")/.." && pwd)"
out="${FUZZ_OUT:-/tmp/ddp-fuzz}"
cxx="${CXX:-clang++-14}"
command -v "$cxx" >/dev/null || { echo "fuzz.sh: $cxx not found (apt-get install clang-14 libfuzzer-14-dev)" >&2; exit 2; }
mkdir -p "$out"

summary=()
crashed=0
for t in "${targets[@]}"; do
  src="$root/test/fuzz/${t}_fuzz.cpp"
  [ -f "$src" ] || { echo "fuzz.sh: unknown target '$t' (no $src)" >&2; exit 2; }
  bin="$out/${t}_fuzz"
  echo "== $t: building $bin"
  "$cxx" -std=c++20 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=undefined -I"$root/include" -I"$root" -isystem /usr/include/eigen3 \
    "$src" -lz -o "$bin" || { echo "fuzz.sh: building $t failed" >&2; exit 2; }

  corpus="$out/corpus/$t"   # grows with what the fuzzer finds; the seeds in the tree stay as they are
  crashes="$out/crashes/$t"
  regress="${FUZZ_REGRESSIONS:-$root/test/fuzz/regressions}/$t"
  rm -rf "$crashes"
  mkdir -p "$corpus" "$crashes" "$regress"
  log="$out/$t.log"
  : >"$log"
  start=$(date +%s)
  runs=0
  execs=0
  while :; do
    left=$((secs - ($(date +%s) - start)))
    [ "$left" -gt 0 ] || break
    runs=$((runs + 1))
    echo "== $t: run $runs, ${left}s"
    set +e
    ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
      "$bin" -max_total_time="$left" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
      -artifact_prefix="$crashes/" "$corpus" "$root/test/fuzz/corpus/$t" >"$log.run" 2>&1
    rc=$?
    set -e
    cat "$log.run" >>"$log"
    n=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log.run" | tail -1 | grep -o '[0-9]*$' || true)
    execs=$((execs + ${n:-0}))
    [ "$rc" -eq 0 ] && break
    echo "== $t: exited $rc (see $log)"
    [ "$runs" -ge 6 ] && break
  done
  last=$(grep -E '^#[0-9]+.*cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 || true)
  cov=$(echo "$last" | grep -o 'cov: [0-9]*' | grep -o '[0-9]*' || echo "?")
  ft=$(echo "$last" | grep -o 'ft: [0-9]*' | grep -o '[0-9]*' || echo "?")
  corp=$(echo "$last" | grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' | sed 's/corp: //' || echo "?")
  found=0
  for f in "$crashes"/*; do
    [ -f "$f" ] || continue
    found=$((found + 1))
    cp -n "$f" "$regress/" || true
    echo "== $t: CRASH input kept as $regress/$(basename "$f")"
  done
  [ "$found" -eq 0 ] || crashed=1
  line="$t: ${secs}s, $execs executions, cov: $cov, ft: $ft, corpus: $corp, crashing inputs: $found (log: $log)"
  summary+=("$line")
  echo "== $line"
done

echo
echo "fuzz.sh summary ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $("$cxx" --version | head -1)):"
for s in "${summary[@]}"; do echo "  $s"; done
if [ "$crashed" -ne 0 ]; then
  echo "fuzz.sh: crashing inputs found; fix the parser, then commit them under test/fuzz/regressions/<target>/"
  exit 1
fi
