#!/bin/bash
# usage: fashion_mnist_flags.sh BINARY: bad flags and values exit 2 with a message naming the problem.
set -uo pipefail  # (checks read with here-strings: grep -q on a pipe may end the writer with SIGPIPE)
bin="$1"
fail() { echo "FAIL: $*"; exit 1; }
expect() {  # expect REGEX ARGS...: exit status 2 and REGEX on stderr
  local want="$1"; shift
  local err rc
  err=$(timeout 30 "$bin" "$@" 2>&1 >/dev/null); rc=$?
  [ "$rc" -eq 2 ] || fail "'$*' exited $rc, expected 2 (stderr: $err)"
  grep -qF -- "$want" <<<"$err" || fail "'$*': stderr '$err' does not match '$want'"
  echo "ok: $* -> $err"
}
expect "unknown flag --bogus" --bogus 1
expect "unknown flag --bogus (valid flags: " --epochs 1 --bogus
expect "unknown flag --bogus" --bogus=1
expect "must be one of cnn|mlp, got 'resnet'" --model resnet
expect "must be one of threads|mpi" --backend nccl
expect "--epochs must be an integer, got 'two'" --epochs two
expect "--epochs must be at least 1" --epochs 0
expect "--world-size must be at least 1" --world-size -3
expect "--lr must be in" --lr -1
expect "--lr must be a number" --lr fast
expect "must be a multiple of --world-size 3" --batch-size 64 --world-size 3
expect "--optimizer must be one of sgd|adam|adamw" --optimizer lbfgs
expect "--bucket-cap-mb must be a number of MiB or auto, got 'big'" --bucket-cap-mb big
expect "--bucket-cap-mb must be in [0, 4096]" --bucket-cap-mb -1
expect "--clip-grad-norm must be a positive number or off, got 'high'" --clip-grad-norm high
expect "--clip-grad-norm must be a positive number or off, got '0'" --clip-grad-norm 0
expect "--clip-grad-norm must be a positive number or off, got 'inf'" --clip-grad-norm inf
expect "--local-sgd and --diloco: choose one" --local-sgd 4 --diloco 8
expect "--local-sgd-warmup and --average-optimizer-state are for --local-sgd H" --local-sgd-warmup 3
expect "--local-sgd-warmup and --average-optimizer-state are for --local-sgd H" --diloco 4 --average-optimizer-state
expect "--outer-lr and --outer-momentum are for --diloco H" --outer-momentum 0.5
expect "--outer-momentum must be in [0, 1), got 1" --diloco 8 --outer-momentum 1
expect "--local-sgd must be at least 0, got -2" --local-sgd -2
expect "--diloco with --deterministic" --diloco 4 --deterministic
expect "drop --zero, --overlap-update and --comm-hook" --local-sgd 4 --zero 1
expect "drop --zero, --overlap-update and --comm-hook" --local-sgd 4 --comm-hook bf16
expect "(--diloco takes --comm-hook bf16 or fp16" --diloco 4 --comm-hook powersgd
expect "--replicas is for --local-sgd or --diloco with --deterministic" --replicas 4
expect "add --replicas R" --local-sgd 4 --deterministic
expect "--node-average K is for --local-sgd H with K < H (got K = 2)" --node-average 2
expect "--node-average K is for --local-sgd H with K < H (got K = 4, H = 4)" --local-sgd 4 --node-average 4
expect "the Gloo backend has no node groups" --local-sgd 4 --node-average 2 --backend gloo
expect "--calibration-cache is for --bucket-cap-mb auto" --calibration-cache /tmp/cal.txt
expect "--bucket-cap-mb auto profiles host tensors" --bucket-cap-mb auto --deterministic true
expect "flag --epochs needs a value" --epochs
expect "--comm-hook must be one of none|bf16|fp16|powersgd[:rank], got 'powersgd2'" --comm-hook powersgd2
expect "--comm-hook powersgd:RANK needs a rank of at least 1, got '0'" --comm-hook powersgd:0
expect "--comm-hook powersgd:RANK needs a rank of at least 1, got 'x'" --comm-hook powersgd:x
expect "--comm-hook powersgd with --deterministic: PowerSGD's low-rank factors" --comm-hook powersgd:2 --deterministic true
expect "--powersgd-warmup is for --comm-hook powersgd; --comm-hook is none" --powersgd-warmup 5
expect "--zero 3: stage 3 (parameters sharded too) is not built" --zero 3
expect "--zero must be 0, 1 or 2, got 'yes'" --zero yes
expect "--zero must be 0, 1 or 2, got '12'" --zero 12
expect "--precision bf16 is for device tensors (--device cuda" --precision bf16
expect "--precision must be one of fp32|tf32|bf16|fp16, got 'fp8'" --precision fp8
expect "--loss-every must be at least 1" --loss-every 0
expect "--clip-grad-norm with --overlap-update: clipping needs every bucket's gradient" --overlap-update --clip-grad-norm 1
expect "--overlap-update must be true or false, got 'maybe'" --overlap-update maybe
expect "--powersgd-warmup must be at least 0, got -1" --comm-hook powersgd --powersgd-warmup -1
expect "--comm-hook bf16 with --deterministic: its exact sums would depend on the world size" --comm-hook bf16 --deterministic true
expect "does not exist" --resume /nonexistent/ckpt.bin
expect "--resume auto resumes from the newest checkpoint of --checkpoint FILE, and there is no --checkpoint" --resume auto
expect "--keep-checkpoints must be at least 1, got 0" --keep-checkpoints 0 --checkpoint /tmp/x
expect "--checkpoint /tmp/ names a directory; give a file" --checkpoint /tmp/
expect "--elastic with --backend mpi: MPICH cannot shrink a communicator" --elastic --backend mpi
expect "--elastic is for --backend gloo" --elastic
expect "--elastic with --zero 1 needs --checkpoint FILE" --elastic --backend gloo --zero 1
expect "--elastic with --local-sgd: the replicas are not kept in memory" --elastic --backend gloo --local-sgd 4
expect "--min-world-size is for --elastic" --min-world-size 2
expect "--max-world-size is for --elastic" --max-world-size 4
expect "--join is for --elastic" --join
expect "--wait-for-joiners waits for processes started with --join, which a job without --max-world-size never admits" \
  --elastic --backend gloo --wait-for-joiners 5
expect "--wait-for-joiners must be 0 or more seconds, got -1" --elastic --backend gloo --max-world-size 4 --wait-for-joiners -1
expect "--join takes its rank and the world size from the job it joins; drop --world-size" \
  --elastic --backend gloo --join --world-size 2
# A joiner with no store to find the job by is told where to look (exit 1).
err=$(env -u MASTER_ADDR -u MASTER_PORT -u DDP_STORE_FILE timeout 30 "$bin" --elastic --backend gloo --join 2>&1 >/dev/null)
rc=$?
[ "$rc" -eq 1 ] || fail "--join without a store exited $rc, expected 1"
grep -qF "join: a process joining an elastic job finds it through the job's store: set MASTER_ADDR and MASTER_PORT" \
  <<<"$err" || fail "--join without a store: $err"
echo "ok: --join without a store -> $err"
expect "unexpected argument 'extra'" extra
expect "must be one of cpu|cuda, got 'tpu'" --device tpu
expect "--device cuda needs the CUDA build: bazel build //examples:fashion_mnist_cuda" --device cuda
# A missing data directory is a clear error (exit 1), naming the directory and what to do.
err=$(timeout 30 "$bin" --data-dir /nonexistent/fm 2>&1 >/dev/null); rc=$?
[ "$rc" -eq 1 ] || fail "--data-dir /nonexistent/fm exited $rc, expected 1"
grep -qF "/nonexistent/fm does not exist" <<<"$err" || fail "missing data dir message: $err"
echo "ok: --data-dir /nonexistent/fm -> $err"
# --resume /dev/zero: refused at once (a run-time error, exit 1), naming the file and what it is; no endless read.
err=$(timeout 30 "$bin" --limit-train 64 --limit-test 64 --resume /dev/zero 2>&1 >/dev/null); rc=$?
[ "$rc" -eq 1 ] || fail "--resume /dev/zero exited $rc, expected 1 (stderr: $err)"
grep -qF "checkpoint /dev/zero is a character device, not a regular file" <<<"$err" || fail "--resume /dev/zero: $err"
echo "ok: --resume /dev/zero -> $err"
out=$("$bin" --help) || fail "--help exited non-zero"
grep -q -- "--limit-train" <<<"$out" || fail "--help does not list --limit-train"
grep -q -- "--comm-hook" <<<"$out" || fail "--help does not list --comm-hook"
echo PASS
