#!/usr/bin/env bash
# Every C++ and CMake block in README.md is a file the build compiles or a test runs, quoted verbatim:
#   <!-- snippet: PATH -->        the block equals the file PATH (relative to the workspace root)
#   <!-- snippet-lines: PATH -->  the block's non-empty lines appear in PATH, in order, up to indentation (an excerpt)
# A ```cpp or ```cmake block without such a marker on the line before it fails the test, as does any difference.
set -euo pipefail
root="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-}"
[ -f "$root/README.md" ] || root="$(cd "$(dirname "$0")/../.." && pwd)"
readme="$root/README.md"
tmp="${TEST_TMPDIR:-$(mktemp -d)}/snippets"
rm -rf "$tmp" && mkdir -p "$tmp"

# Split the README into blocks: tmp/N.{lang,marker,body,line}.
awk -v dir="$tmp" '
  /^```/ && other { other = 0; prev = $0; next }
  /^```/ && !inb { lang = substr($0, 4); if (lang == "cpp" || lang == "cmake") { inb = 1; n++; body = dir "/" n ".body";
                   printf "" > body; print lang > (dir "/" n ".lang"); print prev > (dir "/" n ".marker");
                   print NR > (dir "/" n ".line"); next } else { other = 1; prev = $0; next } }
  /^```/ && inb { inb = 0; close(body); prev = $0; next }
  inb { print >> body; next }
  { prev = $0 }
' "$readme"

fail=0 checked=0
for lang_file in "$tmp"/*.lang; do
  [ -e "$lang_file" ] || break
  n="${lang_file%.lang}"
  line=$(cat "$n.line") marker=$(cat "$n.marker")
  if [[ "$marker" =~ ^\<\!--\ snippet(-lines)?:\ ([^ ]+)\ --\>$ ]]; then
    kind="${BASH_REMATCH[1]}" path="${BASH_REMATCH[2]}"
  else
    echo "README.md:$line: a $(cat "$lang_file") block without a '<!-- snippet: PATH -->' marker on the line before it" >&2
    fail=1; continue
  fi
  if [ ! -f "$root/$path" ]; then echo "README.md:$line: snippet file '$path' does not exist" >&2; fail=1; continue; fi
  if [ -z "$kind" ]; then
    if ! diff -u "$root/$path" "$n.body" > "$n.diff"; then
      echo "README.md:$line: the block differs from $path (--- file, +++ README):" >&2; cat "$n.diff" >&2; fail=1; continue
    fi
  else
    # Each line of the block must occur in the file after the previous one's match.
    if ! awk 'function t(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
              NR == FNR { if (t($0) != "") want[++w] = t($0); next }
              i < w && t($0) == want[i + 1] { i++ } END { exit i == w ? 0 : 1 }' \
         "$n.body" "$root/$path"; then
      echo "README.md:$line: the block's lines are not an in-order excerpt of $path" >&2; fail=1; continue
    fi
  fi
  checked=$((checked + 1))
done
[ "$checked" -gt 0 ] || { echo "no snippets found in README.md" >&2; exit 1; }
[ "$fail" -eq 0 ] || exit 1
echo "readme_snippets_test: $checked README blocks match their files"
