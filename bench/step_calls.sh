#!/bin/bash
# bench/step_calls.sh [REV]: how many calls, distinct functions and distinct headers of include/ddp one step of the
# quickstart passes through on rank 0, from the model's forward to the optimizer's update (zero_grad, forward, loss,
# backward with DDP's reduction, step). Built at -O0 without inlining, so every call of the library is a call;
# counted with valgrind's callgrind as the difference between 5 and 4 steps. REV: a git revision (its include/ and
# this program), default the working tree. Results go in bench/RESULTS.md.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [ $# -ge 1 ]; then
  git -C "$here" archive "$1" include | tar -x -C "$work"
  root="$work"
else
  root="$here"
fi
g++ -std=c++20 -O0 -g -fno-inline -I "$root/include" -I /usr/include/eigen3 "$here/bench/step_calls.cpp" \
  -o "$work/step_calls" -pthread -lz
for k in 4 5; do
  valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$work/cg.$k" "$work/step_calls" "$k" \
    >/dev/null 2>&1
done
python3 - "$work" <<'PY'
import glob, re, sys
work = sys.argv[1]
def tally(path):
    # calls per callee, and each function's file, from callgrind's raw format (names are compressed: "(id) name"
    # the first time, "(id)" after)
    names, files, calls, home = {}, {}, {}, {}
    fl = None
    def ref(table, ident, text):
        if text: table[ident] = text
        return table.get(ident, "?")
    for line in open(path, errors="replace"):
        m = re.match(r"(fl|fi|fe|cfi|cfl|fn|cfn)=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
        if m:
            key, ident, text = m.groups()
            if key in ("fl", "fi", "fe", "cfi", "cfl"):
                name = ref(files, ident, text)
                if key == "fl": fl = name
            elif key == "fn":
                home.setdefault(ref(names, ident, text), fl)
            else:
                callee = ref(names, ident, text)
            continue
        m = re.match(r"calls=(\d+)", line)
        if m: calls[callee] = calls.get(callee, 0) + int(m.group(1))
    return calls, home
def rank0(k):
    # thread 1 is main; the rank threads follow (their counts differ only by who is root): take the busier
    paths = sorted(glob.glob(f"{work}/cg.{k}-*"))
    best = max(paths[1:], key=lambda p: sum(tally(p)[0].values()))
    return tally(best)
(c4, w4), (c5, w5) = rank0(4), rank0(5)
step = {f: c5.get(f, 0) - c4.get(f, 0) for f in c5}
ddp = {f: n for f, n in step.items() if n > 0 and "include/ddp/" in (w5.get(f) or "")}  # defined in the library
heads = sorted({w5[f][w5[f].index("include/ddp/"):] for f in ddp})
print(f"one quickstart step, rank 0: {sum(ddp.values())} calls of {len(ddp)} ddp functions in {len(heads)} headers "
      f"(all calls, Eigen and std included: {sum(n for n in step.values() if n > 0)})")
for h in heads: print("  " + h)
PY
