#!/bin/bash
# usage: fashion_mnist_e2e.sh BINARY: runs the main job on a slice of Fashion-MNIST (threads, 2 ranks, MLP,
# 1 epoch), checks its output, CSV, SVG, per-rank traces and checkpoint, then resumes from the checkpoint;
# then stops a 2-epoch run mid-epoch (--max-steps) and resumes it with another bucket cap (the uninterrupted
# run's bits) and with another world size (the same to rounding); --bucket-cap-mb auto trains the same bits.
set -euo pipefail
bin="$1"
dir="${TEST_TMPDIR:-$(mktemp -d)}/fm"
mkdir -p "$dir"
log="$dir/log.txt"
timeout --kill-after=5 120 "$bin" --limit-train 2048 --limit-test 512 --epochs 1 --model mlp \
  --out "$dir/out" --trace "$dir/trace" --checkpoint "$dir/ckpt.bin" >"$log" 2>&1 || { cat "$log"; echo "FAIL: exit $?"; exit 1; }
cat "$log"
fail() { echo "FAIL: $*"; exit 1; }
grep -q '^epoch 1/1: train loss [0-9.]*  test loss [0-9.]*  test accuracy [0-9.]*% ([0-9]*/512)' "$log" || fail "no epoch summary"
grep -q '^test accuracy: [0-9.]*% ([0-9]*/512) after 1 epoch, ' "$log" || fail "no final accuracy"
acc=$(sed -n 's/^test accuracy: \([0-9]*\)\..*/\1/p' "$log")
[ "$acc" -ge 50 ] || fail "accuracy ${acc}% after one epoch on 2048 images is implausibly low"
csv="$dir/out/metrics.csv"
[ -s "$csv" ] || fail "no $csv"
head -1 "$csv" | grep -q '^epoch,train_loss,test_loss,test_accuracy,' || fail "bad CSV header"
[ "$(wc -l <"$csv")" -eq 2 ] || fail "CSV should have a header and one epoch"
svg="$dir/out/metrics.svg"
grep -q '<svg xmlns="http://www.w3.org/2000/svg"' "$svg" || fail "SVG has no svg element"
tail -1 "$svg" | grep -q '</svg>' || fail "SVG is not closed"
grep -q 'polyline' "$svg" || fail "SVG has no curve"
for r in 0 1; do
  t="$dir/trace/trace_rank$r.json"
  [ -s "$t" ] || fail "no $t"
  grep -q '"name":"optimizer step"' "$t" || fail "$t has no optimizer step span"
  grep -q '"name":"backward"' "$t" || fail "$t has no backward span"
  grep -q '"tid":1' "$t" || fail "$t has no communication lane"
  tail -1 "$t" | grep -q '}' || fail "$t is not closed"
done
[ -s "$dir/ckpt.bin" ] || fail "no checkpoint"
head -c 7 "$dir/ckpt.bin" | grep -q 'DDPCKPT' || fail "checkpoint has no magic"
ls -a "$dir" | grep -q '\.tmp\.' && fail "a temporary checkpoint file was left behind"
# Resume for a second epoch.
timeout --kill-after=5 120 "$bin" --limit-train 2048 --limit-test 512 --epochs 2 --model mlp \
  --resume "$dir/ckpt.bin" --out "$dir/out2" >"$log" 2>&1 || { cat "$log"; fail "resume exited non-zero"; }
cat "$log"
grep -q '^resumed from .*ckpt.bin: epoch 2, step 0' "$log" || fail "no resume line"
grep -q '^epoch 2/2: ' "$log" || fail "resumed run did not train epoch 2"
grep -q '^epoch 1/2: ' "$log" && fail "resumed run repeated epoch 1"
# The resumed run's CSV holds both epochs (epoch 1's row came from the checkpoint).
[ "$(wc -l <"$dir/out2/metrics.csv")" -eq 3 ] || { cat "$dir/out2/metrics.csv"; fail "resumed CSV should have 2 epochs"; }
# (columns epoch..test_total; samples/s is recomputed from the rounded seconds)
sed -n 2p "$dir/out2/metrics.csv" | cut -d, -f1-6 | cmp -s - <(sed -n 2p "$csv" | cut -d, -f1-6) ||
  fail "resumed CSV's epoch 1 differs from the first run's"
# Stopped mid-epoch, resumed with another --bucket-cap-mb (same world size: bitwise, so the same test loss and
# accuracy as the uninterrupted run) and with another --world-size (the same to rounding).
slice=(--limit-train 2048 --limit-test 512 --epochs 2 --model mlp)
run() { timeout --kill-after=5 120 "$bin" "${slice[@]}" "$@" >"$log" 2>&1 || { cat "$log"; fail "$* exited non-zero"; }; cat "$log"; }
run --out "$dir/full"
run --max-steps 40 --checkpoint "$dir/mid.ckpt"
grep -q '^stopped after 40 optimizer steps (--max-steps) at epoch 2, step 8; checkpoint: ' "$log" || fail "no stop line"
grep -q '^epoch 2/2: ' "$log" && fail "the stopped run evaluated epoch 2"
row2() { sed -n 3p "$1" | cut -d, -f3-6; }  # epoch 2: test_loss,test_accuracy,test_correct,test_total
train2() { sed -n 3p "$1" | cut -d, -f2; }  # epoch 2: train_loss (over the whole epoch: the checkpoint carries
                                            # the interrupted epoch's partial sums)
for cap in 0 0.01 100; do
  run --resume "$dir/mid.ckpt" --bucket-cap-mb "$cap" --out "$dir/cap$cap"
  grep -q '^resumed from .*mid.ckpt: epoch 2, step 8 (40 optimizer steps so far)' "$log" || fail "no mid-epoch resume line"
  [ "$(row2 "$dir/cap$cap/metrics.csv")" = "$(row2 "$dir/full/metrics.csv")" ] ||
    fail "resumed with --bucket-cap-mb $cap: epoch 2 is $(row2 "$dir/cap$cap/metrics.csv"), uninterrupted $(row2 "$dir/full/metrics.csv")"
  [ "$(train2 "$dir/cap$cap/metrics.csv")" = "$(train2 "$dir/full/metrics.csv")" ] ||
    fail "resumed with --bucket-cap-mb $cap: epoch 2's train loss is $(train2 "$dir/cap$cap/metrics.csv"), uninterrupted $(train2 "$dir/full/metrics.csv")"
done
# --bucket-cap-mb auto: the cost model chooses the cap (calibrating, then from the cache) and the run trains
# bitwise as the fixed-cap run; a cache that cannot be written is a clear error before anything runs.
for pass in calibrated "calibration from the cache"; do
  run --bucket-cap-mb auto --calibration-cache "$dir/cal.txt" --out "$dir/auto"
  grep -q "^bucket cap: auto chose [0-9.e+-]* MiB, [0-9]* buckets (predicted [0-9.]* ms per step .*; $pass for threads world 2.*; \([1-9][0-9]* sizes probed again between the profiling steps\|no probe between the profiling steps: a node has more ranks than CPUs\))$" "$log" ||
    fail "no auto cap line saying '$pass'"
  [ "$(row2 "$dir/auto/metrics.csv")" = "$(row2 "$dir/full/metrics.csv")" ] ||
    fail "--bucket-cap-mb auto: epoch 2 is $(row2 "$dir/auto/metrics.csv"), with 25 MiB $(row2 "$dir/full/metrics.csv")"
done
[ "$(wc -l <"$dir/cal.txt")" -eq 1 ] || fail "the calibration cache should hold one line"
if timeout --kill-after=5 60 "$bin" "${slice[@]}" --bucket-cap-mb auto --calibration-cache "$dir/no/such/dir/cal.txt" >"$log" 2>&1; then
  cat "$log"; fail "an unwritable calibration cache was accepted"
fi
cat "$log"
grep -q "cannot append to the calibration cache $dir/no/such/dir/cal.txt: No such file or directory" "$log" ||
  fail "the unwritable cache's error does not name it"
grep -q '^epoch ' "$log" && fail "the run trained despite the unwritable cache"
for ws in 4 1; do
  run --resume "$dir/mid.ckpt" --world-size "$ws" --bucket-cap-mb 0.01 --out "$dir/ws$ws"
  paste -d, <(row2 "$dir/ws$ws/metrics.csv") <(row2 "$dir/full/metrics.csv") |
    awk -F, '{ d = $1 - $5; if (d < 0) d = -d; c = $3 - $7; if (c < 0) c = -c; exit !(d <= 1e-4 && c <= 1) }' ||
    fail "resumed on $ws ranks: epoch 2 is $(row2 "$dir/ws$ws/metrics.csv"), uninterrupted $(row2 "$dir/full/metrics.csv")"
  paste -d, <(train2 "$dir/ws$ws/metrics.csv") <(train2 "$dir/full/metrics.csv") |
    awk -F, '{ d = $1 - $2; if (d < 0) d = -d; exit !(d <= 1e-4) }' ||
    fail "resumed on $ws ranks: epoch 2's train loss is $(train2 "$dir/ws$ws/metrics.csv"), uninterrupted $(train2 "$dir/full/metrics.csv")"
done
# Resuming a CNN from the MLP's checkpoint is a clear error on every rank, not a crash or a hang.
if timeout --kill-after=5 60 "$bin" --limit-train 256 --limit-test 64 --model cnn --resume "$dir/ckpt.bin" >"$log" 2>&1; then
  cat "$log"; fail "resuming a CNN from an MLP checkpoint succeeded"
fi
cat "$log"
grep -q "does not fit this model" "$log" || fail "mismatch error does not say what is wrong"
echo PASS
