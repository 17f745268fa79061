#!/bin/bash
# Inside the tarball of tools/gpu/bundle.sh, on a GPU machine: the GPU suite (the same binaries as
# test/comm/run_gpu_tests.sh runs through Bazel) and the main job's step time. It judges the main job's
# accuracies too: a run in tf32, bf16 or fp16 must end within 0.3 points of test accuracy of the fp32 run with the
# same other flags. Exit status: failed steps plus failed judgements, after everything has printed.
# usage: run.sh [FASHION_MNIST_DIR]   (without it, or when it holds no data, the main job is skipped)
#        run.sh --judge RUNS          judges the runs RUNS lists, one a line: a main job's output file, a tab, the
#                                     flags it ran with (test/comm/run_gpu_tests.sh uses it)
#        run.sh --self-test           checks the judgement on made-up outputs (no GPU needed)
set -u
tolerance=0.3  # points of test accuracy (issue 42's bound)

# accuracy FILE: X of the main job's last "test accuracy: X% (...) after N epochs" line, or nothing.
accuracy() { sed -nE 's/.*test accuracy: ([0-9]+(\.[0-9]+)?)%.*/\1/p' "$1" | tail -n 1; }

# judge RUNS: one line per run that is not fp32 (no --precision, or --precision fp32), "ok: ..." or "FAIL: ...",
# naming its precision and flags, its accuracy and the fp32 run's; returns how many failed. A run fails when it is
# more than $tolerance points from the fp32 run with the same flags but --precision (and --data-dir), when it printed
# no final accuracy, or when no such fp32 run printed one.
judge() {
  local runs=$1 out flags p key acc i
  local -a a
  while IFS=$'\t' read -r out flags; do
    read -ra a <<< "$flags"
    p=fp32; key=""
    for ((i = 0; i < ${#a[@]}; i++)); do
      case "${a[i]}" in
        --precision) p="${a[i + 1]:-}"; i=$((i + 1)) ;;
        --precision=*) p="${a[i]#*=}" ;;
        --data-dir) i=$((i + 1)) ;;
        --data-dir=*) ;;
        *) key="$key ${a[i]}" ;;
      esac
    done
    acc=$(accuracy "$out")
    printf '%s\t%s\t%s\n' "${key# }" "$p" "${acc:-none}"
  done < "$runs" | awk -F'\t' -v tol="$tolerance" '
    { k[NR] = $1; p[NR] = $2; a[NR] = $3; if ($2 == "fp32" && $3 != "none") ref[$1] = $3 }
    END {
      bad = 0; n = 0
      for (i = 1; i <= NR; i++) {
        if (p[i] == "fp32") continue
        n++; what = p[i] " (" k[i] ")"
        if (a[i] == "none") { print "FAIL: " what ": printed no final test accuracy"; bad++; continue }
        if (!(k[i] in ref)) {
          print "FAIL: " what ": " a[i] "%, but no fp32 run with the same flags printed a test accuracy"; bad++; continue
        }
        d = a[i] - ref[k[i]]; if (d < 0) d = -d
        ok = (d <= tol + 1e-6); bad += !ok
        printf "%s: %s: %s%% against fp32 %s%%, %.2f points apart (at most %s)\n", (ok ? "ok" : "FAIL"), what, a[i],
               ref[k[i]], d, tol
      }
      printf "accuracy: %d of %d mixed-precision run(s) failed the judgement\n", bad, n
      exit (bad > 100 ? 100 : bad)
    }'
}

self_test() {  # the judgement on made-up outputs: 4 of its 8 runs must fail, each for its reason
  local d rc out
  d=$(mktemp -d)
  fake() {  # name accuracy-of-the-last-epoch-line final-accuracy-or-empty
    { echo "epoch 2/2: train loss 0.30  test loss 0.26  test accuracy $2% (1/1)  time 2.5 s (1.3 ms/step)"
      [ -n "$3" ] && echo "test accuracy: $3% (9000/10000) after 2 epochs, 5.1 s in total (training and evaluation)"
    } > "$d/$1"
  }
  fake f32cnn 99.99 90.62; fake bf16cnn 99.99 90.41; fake f16cnn 10.00 90.32; fake t32cnn 90.62 90.31
  fake f32mlp 86.75 86.75; fake bf16mlp 86.75 86.20; fake f16mlp 86.75 ""; fake bf16b256 88.00 88.00
  printf '[0] %s\n' "$(tail -n 1 "$d/f16cnn")" > "$d/f16cnn.prefixed"  # a launcher's prefix
  cat > "$d/runs" <<EOF
$d/f32cnn	--epochs 2 --model cnn
$d/bf16cnn	--epochs 2 --model cnn --precision bf16 --data-dir /some/where
$d/f16cnn.prefixed	--epochs 2 --precision=fp16 --model cnn
$d/t32cnn	--epochs 2 --model cnn --precision tf32
$d/f32mlp	--epochs 2 --model mlp --precision fp32
$d/bf16mlp	--epochs 2 --model mlp --precision bf16
$d/f16mlp	--epochs 2 --model mlp --precision fp16
$d/bf16b256	--epochs 2 --model cnn --batch-size 256 --precision bf16
EOF
  out=$(judge "$d/runs"); rc=$?
  echo "$out"
  local -a want=(
    "ok: bf16 (--epochs 2 --model cnn): 90.41% against fp32 90.62%, 0.21 points apart (at most 0.3)"
    "ok: fp16 (--epochs 2 --model cnn): 90.32% against fp32 90.62%, 0.30 points apart (at most 0.3)"
    "FAIL: tf32 (--epochs 2 --model cnn): 90.31% against fp32 90.62%, 0.31 points apart (at most 0.3)"
    "FAIL: bf16 (--epochs 2 --model mlp): 86.20% against fp32 86.75%, 0.55 points apart (at most 0.3)"
    "FAIL: fp16 (--epochs 2 --model mlp): printed no final test accuracy"
    "FAIL: bf16 (--epochs 2 --model cnn --batch-size 256): 88.00%, but no fp32 run with the same flags printed a test accuracy"
    "accuracy: 4 of 6 mixed-precision run(s) failed the judgement")
  local w bad=0
  for w in "${want[@]}"; do grep -qxF -- "$w" <<< "$out" || { echo "self-test: missing line: $w"; bad=1; }; done
  [ "$rc" = 4 ] || { echo "self-test: judge returned $rc, not 4"; bad=1; }
  rm -rf "$d"
  [ "$bad" = 0 ] && echo "self-test passed" || echo "self-test FAILED"
  return "$bad"
}

case "${1:-}" in
  --self-test) self_test; exit ;;
  --judge) judge "${2:?usage: run.sh --judge RUNS}"; exit ;;
esac

here="$(cd "$(dirname "$0")" && pwd)"
data="${1:-${DDP_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist/}}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || { echo "no GPU visible"; exit 1; }
dirs=""
for n in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2 libnvrtc.so.13; do
  p=$(find /usr/local /opt /usr/lib -name "$n" 2>/dev/null | head -n 1)
  if [ -z "$p" ]; then echo "$n: not found on this machine"; exit 1; fi
  echo "$n: $p"
  dirs="$dirs:$(dirname "$p")"
done
export LD_LIBRARY_PATH="$here/lib$dirs" PATH="$here/bin:$PATH" DDP_REQUIRE_GPU=1 UCX_WARN_UNUSED_ENV_VARS=n
failed=0
logs=$(mktemp -d)  # each step's whole output (step1.txt, ...), and the main job's runs for the judgement
runs="$logs/runs"; : > "$runs"
steps=0 last_log=""
step() {  # seconds command...: runs it, prints its tail, its status and time
  local limit=$1 t0; shift; t0=$(date +%s%N)
  steps=$((steps + 1)); last_log="$logs/step$steps.txt"
  echo "=== $*"
  timeout "$limit" "$@" 2>&1 | tee "$last_log" | tail -n 30
  local rc=${PIPESTATUS[0]}
  echo "=== rc=$rc in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  [ "$rc" = 0 ] || failed=$((failed + 1))
}
mpi=(mpiexec.hydra -launcher fork -n 1)  # one rank: one GPU
main_job() {  # seconds flags...: the main job on one GPU; its output and flags are kept for the judgement
  local limit=$1; shift
  step "$limit" "${mpi[@]}" "$here/bin/fashion_mnist_cuda" --device cuda --data-dir "$data" "$@"
  printf '%s\t%s\n' "$last_log" "$*" >> "$runs"
}
step 600 "$here/bin/device_cuda_tests"  # device_{kernels,errors}_test.cpp, precision_test.cpp, device_ops_test.cpp
step 120 "${mpi[@]}" "$here/bin/nccl_conformance" --require-gpu
step 120 env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 "$here/bin/nccl_conformance" --rendezvous --require-gpu  # no MPI
step 120 "${mpi[@]}" "$here/bin/ddp_nccl_main" --require-gpu
if [ -e "$data/train-images-idx3-ubyte.gz" ]; then
  main_job 300 --epochs 2 --model cnn
  main_job 300 --epochs 2 --model mlp
  # ZeRO-1 and the overlapped update on NCCL (world size 1), apart and together.
  for z in "--zero 1" "--overlap-update" "--zero 1 --overlap-update"; do
    # shellcheck disable=SC2086
    main_job 120 --epochs 1 --model cnn $z
  done
  # Issue 42: mixed precision, 2 epochs each; judged below against the two fp32 runs above.
  for p in tf32 bf16 fp16; do
    for m in cnn mlp; do
      main_job 300 --epochs 2 --model $m --precision $p
    done
  done
  # --loss-every 50: the steps between reads have no host wait in them (static_graph, asynchronous batch uploads);
  # with 1 the loss is read every step, as before. Each bf16 run is judged against its fp32 twin.
  for p in fp32 bf16; do
    for b in 64 256; do
      for m in cnn mlp; do
        for le in 1 50; do
          main_job 120 --epochs 1 --model $m --batch-size $b --precision $p --loss-every $le
        done
      done
    done
  done
else
  echo "Fashion-MNIST not found in $data: the main job's step time is not measured"
fi
# PyTorch on the same GPU, like for like (where this machine has it): eager fp32 and autocast bf16, and CUDA graphs.
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  for args in "" "--precision bf16" "--cuda-graph" "--precision bf16 --cuda-graph"; do
    # shellcheck disable=SC2086
    step 600 python3 "$here/torch_step.py" --deterministic $args
  done
else
  echo "PyTorch with CUDA not found: the PyTorch side of the step table is not measured"
fi
if [ -s "$runs" ]; then
  echo "=== the main job's accuracies: each precision within $tolerance points of fp32's"
  judge "$runs"
  failed=$((failed + $?))
fi
echo "GPU suite: $failed failed step(s) and judgement(s) on" \
  "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1); outputs in $logs"
exit "$failed"
