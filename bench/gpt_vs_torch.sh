#!/bin/bash
# The GPT step, ddp against PyTorch, interleaved in one run (A B A B ...): nanoGPT's shakespeare_char CPU model
# (4 layers, 4 heads, width 128, block 64) and recipe, 12 sequences of 64 tokens per rank per step, one thread per
# rank. Prints each run's tokens/s (all ranks' tokens, the steps after the first 5, evaluation excluded) and peak
# RSS, the medians, the ratio ddp/torch, and both against the GEMM roofline: one core's SGEMM peak, measured here
# (the best torch.mm of 512², 1024² and 2048² float matrices, one thread, OpenBLAS).
#   bash bench/gpt_vs_torch.sh [ITERS] [ROUNDS]        (defaults 200 and 3; run from the workspace, machine idle)
# Both run with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (this VM family sets them, halving OpenBLAS): torch's
# GEMMs are OpenBLAS's, and so are ddp's GPT job's (//:ddp_openblas). Needs Debian's python3-torch (/usr/bin/python3)
# and libopenblas (tools/setup.sh). Each round also times the step's GEMMs alone (//bench:gpt_gemm_ceiling): the
# tokens/s a plain step could reach if nothing but its matrix products took time.
set -euo pipefail
cd "$(dirname "$0")/.."
iters="${1:-200}"
rounds="${2:-3}"
py=/usr/bin/python3
bazel build -c opt //examples:gpt //bench:gpt_gemm_ceiling >/dev/null 2>&1 ||
  { echo "bazel build //examples:gpt //bench:gpt_gemm_ceiling failed"; exit 1; }
bin=bazel-bin/examples/gpt
ceiling_bin=bazel-bin/bench/gpt_gemm_ceiling
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
torch_env=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS=1)
ddp_env=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)  # ddp's GEMMs are OpenBLAS's too (//:ddp_openblas)

# The peak is the best of ten products at each of three sizes: one size's five products once gave 142 GFLOP/s
# in a noisy second where the step's own GEMMs ran at 197, and a fraction of that "peak" read 114%.
peak=$("${torch_env[@]}" "$py" -c '
import time, torch
torch.set_num_threads(1)
best = 0
for n in (512, 1024, 2048):
    a = torch.randn(n, n); b = torch.randn(n, n)
    for _ in range(2): torch.mm(a, b)
    for _ in range(10):
        t = time.perf_counter(); torch.mm(a, b); best = max(best, 2 * n**3 / (time.perf_counter() - t))
print(f"{best / 1e9:.1f}")')
flops=$("$bin" --help >/dev/null; awk 'BEGIN { C = 128; L = 4; V = 65; T = 64; print 6 * (L * 12 * C * C + C * V + L * 2 * T * C) }')
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; SGEMM peak one core: $peak GFLOP/s (the best torch.mm of 512², 1024² and 2048², OpenBLAS); the model: $flops FLOP per token"

rss() { sed -n 's/^\s*Maximum resident set size (kbytes): //p' "$1"; }
declare -A tps mem
for r in $(seq 1 "$rounds"); do
  # The GEMM-only ceiling (bench/gpt_gemm_ceiling.cpp): the step's products alone, one thread, this round.
  c=$("${ddp_env[@]}" "$ceiling_bin" --reps 100 | sed -n 's/.*ceiling \([0-9]*\) tokens.*/\1/p')
  echo "round $r  GEMM-only ceiling of one rank's step: $c tokens/s"
  tps[ceiling]+="$c "
  for ws in 1 2; do
    /usr/bin/time -v "${torch_env[@]}" "$py" bench/gpt_torch.py --iters "$iters" --world-size "$ws" --bench \
      --log-interval 100000 >"$tmp/t.out" 2>"$tmp/t.time"
    t=$(sed -n 's/^torch tokens\/s: \([0-9]*\).*/\1/p' "$tmp/t.out")
    # torch's peak RSS: the worker's (rank 0's, as the script prints it) times the world size, plus nothing for
    # the spawning parent (which /usr/bin/time reports at world size 2).
    trss=$(sed -n 's/.*peak RSS rank 0: \([0-9.]*\) MiB.*/\1/p' "$tmp/t.out")
    /usr/bin/time -v "${ddp_env[@]}" "$bin" --world-size "$ws" --batch-size $((12 * ws)) --iters "$iters" --eval-interval 0 \
      --sample 0 --log-interval 100000 >"$tmp/d.out" 2>"$tmp/d.time"
    d=$(sed -n 's/^throughput: \([0-9,]*\) tokens.*/\1/p' "$tmp/d.out" | tr -d ,)
    drss=$(awk -v k="$(rss "$tmp/d.time")" 'BEGIN { printf "%.1f", k / 1024 }')
    trss_all=$(awk -v m="$trss" -v w="$ws" 'BEGIN { printf "%.1f", m * w }')
    printf "round %d  world size %d  torch %6d tokens/s (RSS %s MiB over %d process(es))  ddp %6d tokens/s (RSS %s MiB, one process)  ddp/torch %.2f\n" \
      "$r" "$ws" "$t" "$trss_all" "$ws" "$d" "$drss" "$(awk -v a="$d" -v b="$t" 'BEGIN { print a / b }')"
    tps[torch$ws]+="$t "
    tps[ddp$ws]+="$d "
    mem[torch$ws]+="$trss_all "
    mem[ddp$ws]+="$drss "
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
for ws in 1 2; do
  t=$(echo "${tps[torch$ws]}" | median)
  d=$(echo "${tps[ddp$ws]}" | median)
  printf "median, world size %d: torch %.0f tokens/s (%.0f%% of %d core(s)' SGEMM peak), ddp %.0f tokens/s (%.0f%%), ddp/torch %.2f; peak RSS torch %s MiB, ddp %s MiB\n" \
    "$ws" "$t" "$(awk -v x="$t" -v f="$flops" -v p="$peak" -v w="$ws" 'BEGIN { print 100 * x * f / (p * 1e9 * w) }')" "$ws" \
    "$d" "$(awk -v x="$d" -v f="$flops" -v p="$peak" -v w="$ws" 'BEGIN { print 100 * x * f / (p * 1e9 * w) }')" \
    "$(awk -v a="$d" -v b="$t" 'BEGIN { print a / b }')" "$(echo "${mem[torch$ws]}" | median)" "$(echo "${mem[ddp$ws]}" | median)"
done
# What 1.5x torch asks of the plain step, against the GEMM-only ceiling: the fraction of one step left for
# everything that is not a GEMM.
ceil=$(echo "${tps[ceiling]}" | median)
t1=$(echo "${tps[torch1]}" | median)
d1=$(echo "${tps[ddp1]}" | median)
awk -v c="$ceil" -v t="$t1" -v d="$d1" 'BEGIN {
  printf "GEMM-only ceiling (median) %.0f tokens/s: ddp plain reaches %.0f%% of it, torch %.0f%%; 1.5x torch (%.0f tokens/s) is %.0f%% of it, leaving %.1f ms of a %.1f ms step for all but the GEMMs (ddp spends %.1f ms)\n",
    c, 100 * d / c, 100 * t / c, 1.5 * t, 150 * t / c, 768e3 / (1.5 * t) - 768e3 / c, 768e3 / (1.5 * t), 768e3 / d - 768e3 / c }'

