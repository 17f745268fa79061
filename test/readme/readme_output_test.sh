#!/usr/bin/env bash
# usage: readme_output_test.sh TOY FASHION_MNIST GPT ELASTIC: README.md's "Real output" blocks are what the programs
# print.
#  - 00_toy's block is its whole output, digit for digit (the toy is deterministic);
#  - 10_elastic's block ("Elastic training") is its whole output, the seconds and digests masked;
#  - the main jobs' blocks (fashion_mnist, gpt) are runs of the full recipe, so a test cannot repeat them; a short run
#    of each must print the same lines with only the numbers changed: every line of the README's block but progress
#    lines ("...", "epoch 1/2  step", "iter   50/2000") and the GPT's sample text, with each number masked, must be
#    a line of the short run, masked the same way. A renamed flag, a new header line or a reworded result fails it.
set -euo pipefail
toy="$1" fm="$2" gpt="$3" elastic="$4"
root="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-}"
[ -f "$root/README.md" ] || root="$(cd "$(dirname "$0")/../.." && pwd)"
readme="$root/README.md"
dir="${TEST_TMPDIR:-$(mktemp -d)}/readme_output"
mkdir -p "$dir"
fail=0
# The fenced block that follows the first README line containing $1.
block() { awk -v marker="$1" 'found && /^```/ { if (in_block) exit; in_block = 1; next }
                              in_block { print } index($0, marker) { found = 1 }' "$readme"; }
# Numbers (with their separators, signs and exponents) masked as '#'.
mask() { sed -E 's/[-+]?[0-9][0-9.,:e+-]*/#/g'; }

block 'Real output (`bazel run //examples:00_toy`)' >"$dir/toy.readme"
"$toy" >"$dir/toy.out"
if ! cmp -s "$dir/toy.readme" "$dir/toy.out"; then
  echo "README.md's 00_toy output differs from what it prints:" >&2
  diff "$dir/toy.readme" "$dir/toy.out" >&2 || true
  fail=1
fi

# (The digests masked too: the build is -march=native, so the float code, and with it the bits, differ between hosts
# (an Intel and an AMD AVX-512 host print different digests); that the two runs' digests are equal is the program's
# own check: it prints "bitwise the uninterrupted run's" and exits 0 only then, which pipefail makes this test's.)
unvary() { sed -E 's/after [0-9.]+ s/after # s/; s/weights: [0-9a-f]{16}/weights: #/'; }
block 'each change is one line:' | grep -v '^\$ ' | unvary >"$dir/elastic.readme"
"$elastic" | unvary >"$dir/elastic.out"
if ! cmp -s "$dir/elastic.readme" "$dir/elastic.out"; then
  echo "README.md's 10_elastic output differs from what it prints (seconds masked):" >&2
  diff "$dir/elastic.readme" "$dir/elastic.out" >&2 || true
  fail=1
fi

# Masked README lines that must each be a masked line of the short run's output.
shapes() {  # README block on stdin; drops progress lines, the trimmed ones and (GPT) the sample's text
  awk '/^sample \(/ { print; exit } { print }' | grep -v -E '^\.\.\.$|^epoch [0-9]+/[0-9]+  step|^iter +[0-9]+/[0-9]+  loss' | mask
}
compare() {  # name, README marker, program output file
  local name="$1" marker="$2" out="$3" missing=0
  block "$marker" | shapes >"$dir/$name.shapes"
  [ -s "$dir/$name.shapes" ] || { echo "README.md has no real-output block after '$marker'" >&2; fail=1; return; }
  mask <"$out" >"$dir/$name.masked"
  while IFS= read -r line; do
    if ! grep -qxF -- "$line" "$dir/$name.masked"; then
      echo "README.md's $name output has a line the program no longer prints (numbers masked): $line" >&2
      missing=1
    fi
  done <"$dir/$name.shapes"
  if [ "$missing" -ne 0 ]; then
    echo "what the short $name run printed:" >&2
    cat "$out" >&2
    fail=1
  fi
}

timeout --kill-after=5 300 "$fm" --limit-train 512 --limit-test 128 >"$dir/fm.out" 2>&1 || { cat "$dir/fm.out"; exit 1; }
compare fashion_mnist 'trains the seeds'"'"' BasicNet CNN on Fashion-MNIST' "$dir/fm.out"
timeout --kill-after=5 300 "$gpt" --iters 20 --eval-interval 10 --log-interval 10 --sample 40 >"$dir/gpt.out" 2>&1 ||
  { cat "$dir/gpt.out"; exit 1; }
compare gpt 'trains nanoGPT'"'"'s `shakespeare_char` CPU recipe' "$dir/gpt.out"
[ "$fail" -eq 0 ] || exit 1
echo "readme_output_test: 00_toy's and 10_elastic's output, and the main jobs' real-output lines, match what the programs print"
