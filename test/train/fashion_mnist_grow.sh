#!/bin/bash
# usage: fashion_mnist_grow.sh BINARY: the main job grows in place over Gloo (--elastic --max-world-size, processes
# started with --join), --deterministic. (1) 3 ranks on a file store, a process joins: the job goes on at 4 from a
# step boundary and ends with the uninterrupted run's weights digest; joiners with another model, other flags or
# another binary are refused, each naming what differs, and the job does not notice them; a joiner of the ended job is
# told so. (1b) 2 ranks at --min-world-size 2 lose one; the survivor waits (--wait-for-joiners) and a joiner takes
# its place, bitwise. (2) 4 ranks on rank 0's TCP store lose rank 3, then rank 2, and a process joins: 4 -> 3 -> 2 -> 3, the
# uninterrupted digest, each change one line.
set -euo pipefail
source "${TEST_SRCDIR:-$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../..}/${TEST_SRCDIR:+$TEST_WORKSPACE/}test/tools/own_processes.sh"
bin="$(realpath "$1")"
dir="${TEST_TMPDIR:-$(mktemp -d)}/grow"
rm -rf "$dir" && mkdir -p "$dir"
fail() {
  echo "FAIL: $*"
  for f in "$dir"/*.log; do
    echo "== $f" && tail -4 "$f"
    grep "^ddp elastic: " "$f" || true
  done
  exit 1
}
common=(--deterministic --micro-batches 12 --batch-size 24 --limit-train 24000 --limit-test 128 --epochs 1 --model mlp)
digest_of() { sed -n 's/^weights: \([0-9a-f]\{16\}\) .*/\1/p' "$1" | tail -1; }
timeout 300 "$bin" "${common[@]}" --world-size 1 >"$dir/ref.log" 2>&1 || fail "threads run failed"
ref=$(digest_of "$dir/ref.log")
[[ "$ref" =~ ^[0-9a-f]{16}$ ]] || fail "no weights digest from the threads run"

# start N NAME ENV... -- FLAGS...: N ranks in the background (logs NAME.rank<r>.log, pids in $pids).
start() {
  local n="$1" name="$2"
  shift 2
  local env=()
  while [[ "$1" != -- ]]; do env+=("$1") && shift; done
  shift
  pids=()
  for ((r = 0; r < n; r++)); do
    env "${env[@]}" RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n DDP_TIMEOUT=20 \
      timeout 300 "$bin" "$@" --backend gloo --elastic >"$dir/$name.rank$r.log" 2>&1 &
    pids+=($!)
  done
}
# join LOG BINARY ENV... -- FLAGS...: a process that joins, in the background (pid in $joiner).
join() {
  local log="$1" b="$2"
  shift 2
  local env=()
  while [[ "$1" != -- ]]; do env+=("$1") && shift; done
  shift
  env "${env[@]}" DDP_TIMEOUT=20 timeout 300 "$b" "$@" --backend gloo --elastic --join >"$dir/$log" 2>&1 &
  joiner=$!
}
# changes NAME K: waits until rank 0 has printed K change lines (up to 60 s).
changes() {
  for _ in $(seq 600); do
    (($(grep -c "^ddp elastic: " "$dir/$1.rank0.log" 2>/dev/null || true) >= $2)) && return 0
    sleep 0.1
  done
  fail "$1: rank 0 printed fewer than $2 change lines"
}
progress() {  # progress NAME: waits until rank 0 has printed a progress line (a step every rank took)
  for _ in $(seq 1500); do
    grep -Eq '^epoch [0-9]+/[0-9]+ +step +[0-9]+/' "$dir/$1.rank0.log" 2>/dev/null && return 0
    sleep 0.2
  done
  fail "$1: rank 0 printed no progress line"
}
kill_rank() {  # kill_rank R: SIGKILLs the process of rank R (the job's ranks are the only ones with RANK set)
  local pid=""
  for p in $(own_pids "$bin"); do
    [[ "$(cat "/proc/$p/comm" 2>/dev/null)" == timeout ]] && continue
    if grep -qx "RANK=$1" < <(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null); then pid=$p; fi
  done
  [[ -n "$pid" ]] || fail "no process of rank $1 to kill"
  kill -KILL "$pid"
}

# (1) 3 -> 4 on a file store, with three joiners refused.
store=(DDP_STORE_FILE="$dir/grow.store")
flags=("${common[@]}" --max-world-size 4)
start 3 grow "${store[@]}" -- "${flags[@]}"
cp "$bin" "$dir/other_build" && printf 'x' >>"$dir/other_build"  # another binary: one byte more
join model.log "$bin" "${store[@]}" -- "${flags[@]/mlp/cnn}"
p_model=$joiner
join flags.log "$bin" "${store[@]}" -- "${flags[@]}" --lr 0.01
p_flags=$joiner
join binary.log "$dir/other_build" "${store[@]}" -- "${flags[@]}"
p_binary=$joiner
for p in $p_model $p_flags $p_binary; do wait $p && fail "a joiner that differs was admitted"; done
progress grow  # (mid-epoch: the joiner takes the state of a step the others trained up to)
join joiner.log "$bin" "${store[@]}" -- "${flags[@]}"
grep -q "refused to join the job at file store $dir/grow.store: this process's model is '8 tensors, 1199882 values, .*', the job's is '6 tensors, 235146 values, " \
  "$dir/model.log" || fail "the joiner with another model was not refused naming the model"
grep -q "refused to join .*: this process's flag --lr is '0.01', the job's is '(its default)'" "$dir/flags.log" ||
  fail "the joiner with other flags was not refused naming the flag"
grep -q "refused to join .*: this process's binary is 'ddp [0-9.]*, executable of [0-9]* bytes, FNV-1a 64 [0-9a-f]*', the job's is " \
  "$dir/binary.log" || fail "the joiner with another binary was not refused naming the binary"
for p in "${pids[@]}" "$joiner"; do wait "$p" || fail "grow: a rank or the joiner failed"; done
line=$(grep "^ddp elastic: " "$dir/grow.rank0.log")
[[ "$line" =~ ^ddp\ elastic:\ rank\ 3\ joined\ at\ step\ ([0-9]+)\;\ continuing\ at\ world\ size\ 4\ from\ step\ ([0-9]+)\ after ]] ||
  fail "grow: unexpected change line: $line"
[[ "${BASH_REMATCH[1]}" == "${BASH_REMATCH[2]}" ]] || fail "grow: resumed at another step: $line"
((BASH_REMATCH[1] > 0)) || fail "grow: the joiner came before the first step: $line"
grep -q "^epoch 1/1: membership changes: 3 -> 4 ranks at step ${BASH_REMATCH[1]}\$" "$dir/grow.rank0.log" ||
  fail "grow: rank 0 did not list the change after the epoch"
[[ "$(digest_of "$dir/grow.rank0.log")" == "$ref" ]] || fail "grow: weights $(digest_of "$dir/grow.rank0.log"), uninterrupted: $ref"
echo "PASS: 3 -> 4 on a file store, bitwise ($ref); refused: $(sed 's/.*: this process/this process/' "$dir/model.log" | cut -c1-60)...; $line"
join late.log "$bin" "${store[@]}" -- "${flags[@]}"
wait $joiner && fail "a joiner of the ended job was admitted"
grep -q "the job at file store $dir/grow.store has ended; nothing to join" "$dir/late.log" ||
  fail "the joiner of the ended job was not told so"

# (1b) Below --min-world-size the survivors wait --wait-for-joiners for a joiner, which takes the lost rank's place:
# 2 ranks at a minimum of 2, rank 1 SIGKILLed, a process joins: the job goes on at 2, bitwise.
store=(DDP_STORE_FILE="$dir/wait.store")
flags=("${common[@]}" --min-world-size 2 --max-world-size 2 --wait-for-joiners 60)
start 2 wait "${store[@]}" -- "${flags[@]}"
progress wait
kill_rank 1
sleep 1  # (the survivor is waiting for a joiner now)
join wait.joiner.log "$bin" "${store[@]}" -- "${flags[@]}"
for p in "${pids[0]}" "$joiner"; do wait "$p" || fail "wait: the survivor or the joiner failed"; done
line=$(grep "^ddp elastic: " "$dir/wait.rank0.log")
re='^ddp elastic: rank 1 lost at step ([0-9]+) \(it ended: [^)]*\); rank 1 joined; continuing at world size 2 from step ([0-9]+) after'
[[ "$line" =~ $re && "${BASH_REMATCH[1]}" == "${BASH_REMATCH[2]}" ]] || fail "wait: unexpected change line: $line"
[[ "$(digest_of "$dir/wait.rank0.log")" == "$ref" ]] || fail "wait: weights $(digest_of "$dir/wait.rank0.log"), uninterrupted: $ref"
echo "PASS: below the minimum, a joiner took the lost rank's place, bitwise: $line"

# (2) 4 -> 3 -> 2 -> 3 on rank 0's TCP store.
tcp=(MASTER_ADDR=127.0.0.1 MASTER_PORT=$((20000 + RANDOM % 20000)))
flags=("${common[@]}" --max-world-size 4 --min-world-size 2)
start 4 seq "${tcp[@]}" -- "${flags[@]}"
progress seq
kill_rank 3
changes seq 1
kill_rank 2
changes seq 2
join seq.joiner.log "$bin" "${tcp[@]}" -- "${flags[@]}"
changes seq 3
for p in "${pids[0]}" "${pids[1]}" "$joiner"; do wait "$p" || fail "seq: a survivor or the joiner failed"; done
mapfile -t lines < <(grep "^ddp elastic: " "$dir/seq.rank0.log")
steps=()
for k in 0 1 2; do  # (each resumes at the step it names)
  want=("rank 3 lost at step ([0-9]+) \\(it ended: [^)]*\\); continuing at world size 3 from step ([0-9]+) after"
    "rank 2 lost at step ([0-9]+) \\(it ended: [^)]*\\); continuing at world size 2 from step ([0-9]+) after"
    "rank 2 joined at step ([0-9]+); continuing at world size 3 from step ([0-9]+) after")
  re="^ddp elastic: ${want[$k]}"
  [[ "${lines[$k]:-}" =~ $re ]] || fail "seq: change $((k + 1)) is '${lines[$k]:-}'"
  [[ "${BASH_REMATCH[1]}" == "${BASH_REMATCH[2]}" ]] || fail "seq: resumed at another step: ${lines[$k]}"
  steps+=("${BASH_REMATCH[1]}")
done
s1=${steps[0]} s2=${steps[1]} s3=${steps[2]}
grep -q "^epoch 1/1: membership changes: 4 -> 3 ranks at step $s1, 3 -> 2 ranks at step $s2, 2 -> 3 ranks at step $s3\$" \
  "$dir/seq.rank0.log" || fail "seq: rank 0 did not list the three changes after the epoch"
[[ "$(digest_of "$dir/seq.rank0.log")" == "$ref" ]] || fail "seq: weights $(digest_of "$dir/seq.rank0.log"), uninterrupted: $ref"
echo "PASS: 4 -> 3 -> 2 -> 3 on rank 0's TCP store, bitwise ($ref):"
printf '  %s\n' "${lines[@]}"
