#!/usr/bin/env bash
# README figures that a test asserts or bench/RESULTS.md records: each row pairs a phrase of README.md with the
# assertion or the recorded measurement that backs it, and the test fails when either side changes without the other
# (a README bound that no test checks, a test constant the README misquotes, a range that leaves out a recorded run). Rows: README_TEXT <TAB> FILE <TAB> FILE_TEXT (fixed strings; FILE relative to the workspace).
set -euo pipefail
root="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-}"
[ -f "$root/README.md" ] || root="$(cd "$(dirname "$0")/../.." && pwd)"
rows=$(cat <<'ROWS'
30 steps stay within 2e-3 (bf16) and 4e-4 (fp16) of the float run	test/parallel/compressed_test.cpp	CHECK(bf[0] <= 2e-3);
30 steps stay within 2e-3 (bf16) and 4e-4 (fp16) of the float run	test/parallel/compressed_test.cpp	CHECK(fp[0] <= 4e-4);
30 steps stay within 2e-3 (bf16) and 4e-4 (fp16) of the float run	test/parallel/ddp_suite.hpp	bf <= 2e-3 && fp <= 4e-4
takes 1.00–1.20 times training alone, against 1.11–1.30 stepping after backward	bench/RESULTS.md	| 6 | 133.4 | 173.8 | 176.1 | 159.6 | 1.303 | 1.320 | **1.196** | 0.919 |
takes 1.00–1.20 times training alone, against 1.11–1.30 stepping after backward	bench/RESULTS.md	| 5 | 143.7 | 169.8 | 172.4 | 144.3 | 1.182 | 1.200 | **1.005** | 0.850 |
sends 1/60 (CNN) to 1/67 (MLP) of float's bytes	bench/RESULTS.md	| cnn | powersgd:2 | 90.21% | −0.41 | 80,016 | 1/60 |
sends 1/60 (CNN) to 1/67 (MLP) of float's bytes	bench/RESULTS.md	| mlp | powersgd:2 | 87.49% | −0.26 | 14,128 | 1/67 |
sends 1/60 (CNN) to 1/67 (MLP) of float's bytes	include/ddp/parallel/policies.hpp	1/60
ddp/PyTorch 1.58–1.59 plain (three runs	bench/RESULTS.md	median, world size 1: torch 20131 tokens/s (48% of 1 core(s)' SGEMM peak), ddp 31761 tokens/s (76%), ddp/torch 1.58
ddp/PyTorch 1.58–1.59 plain (three runs	bench/RESULTS.md	median, world size 1: torch 19535 tokens/s (48% of 1 core(s)' SGEMM peak), ddp 31036 tokens/s (76%), ddp/torch 1.59
ddp/PyTorch 1.58–1.59 plain (three runs	bench/RESULTS.md	median, world size 1: torch 19662 tokens/s (53% of 1 core(s)' SGEMM peak), ddp 31036 tokens/s (84%), ddp/torch 1.58
single rounds 1.49–1.79	bench/RESULTS.md	| 1.49 / 1.79 / 1.54 / 1.53 / 1.58 | **1.58** |
1.89–1.98 at world size 2	bench/RESULTS.md	median, world size 2: torch 31932 tokens/s (38% of 2 core(s)' SGEMM peak), ddp 60254 tokens/s (73%), ddp/torch 1.89
1.89–1.98 at world size 2	bench/RESULTS.md	median, world size 2: torch 29299 tokens/s (40% of 2 core(s)' SGEMM peak), ddp 58065 tokens/s (79%), ddp/torch 1.98
the code before the tiles gave 1.60 on that host	bench/RESULTS.md	| 1 | 20,167 / 18,800 / 19,622 | 31,462 / 31,747 / 31,122 | 1.56 / 1.69 / 1.59 | **1.60** |
and 1.43–1.50 in three runs	bench/RESULTS.md	median, world size 1: torch 23556 tokens/s (53% of 1 core(s)' SGEMM peak), ddp 33742 tokens/s (76%), ddp/torch 1.43
and 1.43–1.50 in three runs	bench/RESULTS.md	median, world size 1: torch 21877 tokens/s (52% of 1 core(s)' SGEMM peak), ddp 32847 tokens/s (78%), ddp/torch 1.50
and 1.43–1.50 in three runs	bench/RESULTS.md	plain 1.47 (rounds 1.44 / 1.44 / 1.49)
single rounds 1.39–1.63	bench/RESULTS.md	| 1.56 / 1.39 / 1.63 / 1.58 / 1.47 | **1.50** |
gave 1.58 in nine rounds in a quiet	bench/RESULTS.md	median, world size 1: torch 19933 tokens/s (48% of 1 core(s)' SGEMM peak), ddp 31531 tokens/s (77%), ddp/torch 1.58
every round 1.56–1.64	bench/RESULTS.md	| 1.57 / 1.59 / 1.58 / 1.57 / 1.59 / 1.56 / 1.64 / 1.59 / 1.62 |
1.89 at world size 2) and 1.46	bench/RESULTS.md	median, world size 2: torch 32339 tokens/s (39% of 2 core(s)' SGEMM peak), ddp 61105 tokens/s (74%), ddp/torch 1.89
1.89 at world size 2) and 1.46	bench/RESULTS.md	median, world size 1: torch 18820 tokens/s (53% of 1 core(s)' SGEMM peak), ddp 27534 tokens/s (77%), ddp/torch 1.46
13.9k–19.4k tokens/s between rounds	bench/RESULTS.md	| 1 | 14,272 / 19,426 / 18,820 / 19,033 / 13,858 |
ROWS
)
fail=0 checked=0
# README lines are wrapped: compare with the README's whitespace folded to single spaces (read once; grep -q on a pipe
# could end the writer with SIGPIPE, which pipefail would count as a miss).
folded=$(tr '\n' ' ' <"$root/README.md" | tr -s ' ')
while IFS=$'\t' read -r readme file text; do
  [ -n "$readme" ] || continue
  if ! grep -qF -- "$readme" <<<"$folded"; then
    echo "README.md no longer says '$readme' (asserted by $file: '$text'): update both together" >&2
    fail=1
  fi
  if ! grep -qF -- "$text" "$root/$file"; then
    echo "$file no longer asserts '$text', which README.md quotes as '$readme': update both together" >&2
    fail=1
  fi
  checked=$((checked + 1))
done <<<"$rows"
[ "$fail" -eq 0 ] || exit 1
echo "readme_figures_test: $checked README figures match the assertions behind them"
