#!/usr/bin/env bash
# The tree follows .clang-format: every tracked C++ file is what clang-format (14, from apt) would write.
# Runs against the source tree the runfiles point into (tagged "external": never cached, so it sees every edit).
set -euo pipefail
command -v clang-format >/dev/null || { echo "format_test: clang-format is not installed (run tools/setup.sh)" >&2; exit 1; }
marker="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-}/.clang-format"
[ -e "$marker" ] || marker="$(dirname "$0")/../../.clang-format"
root="$(cd "$(dirname "$(readlink -f "$marker")")" && pwd)"
cd "$root"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.hpp' '*.cpp' '*.cu' ':!:third_party/**')
else
  mapfile -t files < <(find include examples test bench tools -name '*.hpp' -o -name '*.cpp' -o -name '*.cu' | sort)
fi
[ "${#files[@]}" -gt 0 ] || { echo "format_test: no C++ files found under $root" >&2; exit 1; }
existing=()
for f in "${files[@]}"; do [ -f "$f" ] && existing+=("$f"); done
bad=()
# One clang-format process for the whole tree (one per file cost ~30 s); only a failure looks file by file.
if ! clang-format --style=file --dry-run --Werror "${existing[@]}" >/dev/null 2>&1; then
  for f in "${existing[@]}"; do
    clang-format --style=file --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
fi
if [ "${#bad[@]}" -gt 0 ]; then
  echo "format_test: ${#bad[@]} file(s) differ from .clang-format; fix with: clang-format -i ${bad[*]}" >&2
  exit 1
fi
echo "format_test: ${#files[@]} files follow .clang-format"
