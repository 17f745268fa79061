#!/bin/bash
# usage: gpt_e2e.sh BINARY: the GPT job end to end on a small model over the vendored tinyshakespeare: progress with
# tokens/s and ETA, validation losses over the whole split at intervals and at the end, a sample, losses.csv/.svg,
# one trace per rank, a checkpoint that a second run (at another world size) resumes from, the comm hooks, ZeRO
# and the overlapped update without --deterministic, and local SGD and DiLoCo.
set -euo pipefail
bin="$1"
dir="${TEST_TMPDIR:-$(mktemp -d)}/gpt"
mkdir -p "$dir"
log="$dir/log.txt"
fail() { echo "FAIL: $*"; cat "$log"; exit 1; }
small=(--n-layer 1 --n-head 2 --n-embd 32 --block-size 16 --batch-size 8 --warmup 5 --log-interval 10)
run() { timeout --kill-after=5 120 "$bin" "${small[@]}" "$@" >"$log" 2>&1 || fail "'$*' exited non-zero"; }

run --iters 30 --eval-interval 10 --sample 80 --out "$dir/out" --trace "$dir/trace" --checkpoint "$dir/ckpt"
grep -qE '^gpt: [0-9,]+ parameters \(1 layers, 2 heads, width 32, block 16, vocabulary 65\), threads backend, world size 2' "$log" || fail "no header"
grep -qE '^iter +10/30  loss [0-9.]+  lr [0-9.e+-]+  [0-9,]+ tokens/s  ETA [0-9]+:[0-9]{2}$' "$log" || fail "no progress line"
[ "$(grep -cE '^iter (10|20|30): train loss [0-9.]+, val loss [0-9.]+ \(the whole validation split: 6,971 blocks of 16\)$' "$log")" -eq 3 ] ||
  fail "expected validation losses at 10, 20 and 30"
grep -qE '^val loss: [0-9.]+ after 30 iterations' "$log" || fail "no final val loss"
grep -qE '^sample \(80 characters, temperature 0.8, seed 1\):$' "$log" || fail "no sample"
[ "$(head -1 "$dir/out/losses.csv")" = "iter,train_loss,val_loss,lr,tokens_per_second" ] || fail "bad CSV header"
[ "$(wc -l <"$dir/out/losses.csv")" -eq 4 ] || fail "CSV rows: $(cat "$dir/out/losses.csv")"
grep -q '<svg' "$dir/out/losses.svg" || fail "no SVG"
for r in 0 1; do [ -s "$dir/trace/trace_rank$r.json" ] || fail "no trace for rank $r"; done
# The loss falls: the last validation loss is below the first.
first=$(sed -n 2p "$dir/out/losses.csv" | cut -d, -f3)
last=$(tail -1 "$dir/out/losses.csv" | cut -d, -f3)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "validation loss did not fall ($first -> $last)"

# Resumed at world size 4 to 40 iterations: continues from 30, and its CSV keeps the rows before the resume.
run --iters 40 --eval-interval 10 --world-size 4 --resume "$dir/ckpt" --out "$dir/out2" --sample 0
grep -q "^resumed from $dir/ckpt at iteration 30" "$log" || fail "no resume line"
[ "$(wc -l <"$dir/out2/losses.csv")" -eq 5 ] || fail "resumed CSV: $(cat "$dir/out2/losses.csv")"

# What users combine without --deterministic: each comm hook, ZeRO-1 and -2, and hook + ZeRO + overlapped update.
for extra in "--grad-accum 2" "--comm-hook bf16" "--comm-hook fp16" "--comm-hook powersgd:2 --powersgd-warmup 3" "--zero 1" "--zero 2" \
  "--comm-hook bf16 --zero 1 --overlap-update --clip 0"; do
  # shellcheck disable=SC2086
  run --iters 8 --eval-interval 0 --sample 0 $extra
  grep -qE '^val loss: [0-9.]+ after 8 iterations' "$log" || fail "$extra: no final val loss"
done
# Local SGD after 4 synchronous steps, averaging every 2, and DiLoCo every 4: each trains and reports its bytes.
run --iters 8 --eval-interval 0 --sample 0 --local-sgd 2 --local-sgd-warmup 4
grep -qE '^communication: [0-9]+ bytes a local step \(2 parameter averages in 4 local steps\), 1/2.0 of DDP' "$log" ||
  fail "local SGD: no communication line"
run --iters 8 --eval-interval 0 --sample 0 --diloco 4
grep -qE '^val loss: [0-9.]+ after 8 iterations' "$log" || fail "DiLoCo: no final val loss"
grep -qE '^communication: [0-9]+ bytes a local step \(2 outer steps in 8 local steps\), 1/4.0 of DDP' "$log" ||
  fail "DiLoCo: no communication line"
echo "PASS"
