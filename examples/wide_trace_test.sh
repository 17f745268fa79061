#!/bin/bash
# The wide example's collective trace (DDP_TRACE_COLLECTIVES=1): per rank, one broadcast per parameter at
# construction and one all-reduce per bucket per step, in the same order on every rank.
set -euo pipefail
bin="$1"
steps=2
out=$(DDP_TRACE_COLLECTIVES=1 timeout 120 "$bin" --steps "$steps" --hidden 2000 --bucket-cap-mb 1 2>&1)
echo "$out" | grep -v '^ddp-trace' || true
buckets=$(echo "$out" | sed -n 's/.* in \([0-9]*\) buckets\(, [0-9]* bytes a step\)\{0,1\}$/\1/p')
params=$(echo "$out" | sed -n 's/.*: \([0-9]*\) parameters (.*/\1/p')
[ -n "$buckets" ] && [ -n "$params" ] || { echo "FAIL: could not read the bucket/parameter counts"; exit 1; }
fail=0
for r in 0 1; do
  bc=$(echo "$out" | grep -c "^ddp-trace rank=$r op=broadcast .*tag=ddp.param:" || true)
  ar=$(echo "$out" | grep -c "^ddp-trace rank=$r op=all_reduce .*tag=bucket:" || true)
  order=$(echo "$out" | grep "^ddp-trace rank=$r op=all_reduce .*tag=bucket:" | sed 's/.*tag=bucket:\([0-9]*\).*/\1/' | tr '\n' ' ')
  expect_order=$(for s in $(seq 1 $steps); do seq 0 $((buckets - 1)); done | tr '\n' ' ')
  echo "rank $r: $bc broadcasts (expect $params), $ar bucket all-reduces (expect $((buckets * steps))), order: $order"
  [ "$bc" -eq "$params" ] || fail=1
  [ "$ar" -eq $((buckets * steps)) ] || fail=1
  [ "$order" = "$expect_order" ] || fail=1
done
[ "$buckets" -ge 2 ] || { echo "FAIL: expected several 1 MiB buckets, got $buckets"; fail=1; }
exit $fail
