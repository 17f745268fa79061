#!/bin/bash
# usage: gpt_flags.sh BINARY: bad flags, a missing or empty text file, and a checkpoint of another model shape,
# position table or vocabulary each end with a message naming the problem (and a non-zero exit), never a crash.
set -uo pipefail
bin="$1"
dir="${TEST_TMPDIR:-$(mktemp -d)}/gptflags"
mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
expect() {  # expect CODE TEXT ARGS...: exit status CODE and TEXT (fixed string) on stderr
  local code="$1" want="$2"; shift 2
  local err rc
  err=$(timeout 60 "$bin" "$@" 2>&1 >/dev/null); rc=$?
  [ "$rc" -eq "$code" ] || fail "'$*' exited $rc, expected $code (stderr: $err)"
  grep -qF -- "$want" <<<"$err" || fail "'$*': stderr '$err' does not contain '$want'"
  echo "ok: $* -> $err"
}
small=(--n-layer 1 --n-head 2 --n-embd 32 --block-size 16 --batch-size 8 --warmup 2 --eval-interval 0 --sample 0)
expect 2 "unknown flag --bogus" --bogus 1
expect 2 "--iters must be at least 1" --iters 0
expect 2 "--n-embd 30 is not a multiple of --n-head 4" --n-embd 30
expect 2 "--dropout must be in [0, 1), got 1.5" --dropout 1.5
expect 2 "--temperature must be > 0, got 0" --temperature 0
expect 2 "must be a multiple of --world-size 5" --batch-size 24 --world-size 5
expect 2 "--grad-accum with --deterministic" --grad-accum 2 --deterministic
expect 2 "gpt: --elastic is for --backend gloo" --elastic
expect 2 "gpt: --elastic with --diloco: the replicas are not kept in memory" --elastic --backend gloo --diloco 4
expect 2 "gpt: --max-world-size is for --elastic" --max-world-size 4
expect 2 "must be a multiple of --world-size 2 times --grad-accum 5" --grad-accum 5
expect 2 "--backend must be one of threads|mpi|gloo" --backend nccl
expect 2 "--clip with --overlap-update" --overlap-update
expect 2 "--resume $dir/none does not exist" --resume "$dir/none"
expect 2 "gpt: --resume auto resumes from the newest checkpoint of --checkpoint FILE" --resume auto
expect 2 "--keep-checkpoints 5000 is more than 1000" --keep-checkpoints 5000
expect 1 "$dir/missing.txt: cannot open: no such file" --data "$dir/missing.txt"
: >"$dir/empty.txt"
expect 1 "$dir/empty.txt: the file is empty" --data "$dir/empty.txt"
printf 'abc' >"$dir/tiny.txt"
expect 1 "tiny.txt" --data "$dir/tiny.txt"
expect 2 "gpt: --local-sgd with --grad-accum" --local-sgd 4 --grad-accum 2
expect 2 "gpt: --replicas is for --local-sgd or --diloco with --deterministic" --diloco 4 --replicas 2
expect 2 "--local-sgd and --diloco: choose one" --local-sgd 4 --diloco 4
# A checkpoint, then resumes that do not fit it.
timeout 60 "$bin" "${small[@]}" --iters 3 --checkpoint "$dir/ckpt" >/dev/null 2>&1 || fail "could not write a checkpoint"
expect 1 "parameter 'wte.weight' is (65, 32) in the file but (65, 64) in the model" "${small[@]}" --n-embd 64 --iters 4 --resume "$dir/ckpt"
expect 1 "parameter 'wpe.weight' is (16, 32) in the file but (32, 32) in the model" "${small[@]}" --block-size 32 --iters 4 --resume "$dir/ckpt"
# 65 characters, as many as tinyshakespeare's, but other ones: the shapes fit, the ids would not mean the same.
awk 'BEGIN { srand(1); for (i = 0; i < 20000; i++) printf "%c", 33 + int(rand() * 65) }' >"$dir/other.txt"
expect 1 "another vocabulary" "${small[@]}" --iters 4 --resume "$dir/ckpt" --data "$dir/other.txt"
# --resume auto: another model's checkpoint is refused by name (not skipped, not written over); this model's resumes.
expect 1 "parameter 'wte.weight' is (65, 32) in the file but (65, 64) in the model" "${small[@]}" --n-embd 64 --iters 4 --checkpoint "$dir/ckpt" --resume auto
out=$(timeout 60 "$bin" "${small[@]}" --iters 4 --checkpoint "$dir/ckpt" --resume auto 2>&1) || fail "--resume auto failed: $out"
grep -qF "resumed from $dir/ckpt at iteration 3" <<<"$out" || fail "--resume auto did not resume from $dir/ckpt: $out"
[ -e "$dir/ckpt.1" ] || fail "--resume auto's next checkpoint did not keep the one before as $dir/ckpt.1"
echo "ok: --resume auto resumed from $dir/ckpt at iteration 3 and kept it as ckpt.1"
echo "PASS"
