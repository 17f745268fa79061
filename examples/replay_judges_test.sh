#!/bin/bash
# usage: replay_judges_test.sh REPLAY FIXTURE_DIR: replay judges, it does not only print. The toy fixture's ws2
# run passes as shipped; with one of rank 0's recorded losses moved by 1e-3 it fails on the losses, and with one
# final weight replaced it fails on the weights (exit 1 and the reason, both times).
set -euo pipefail
replay="$1" fixture="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
run() {  # run DIR EXPECTED_EXIT EXPECTED_TEXT
  local out rc=0
  out=$(timeout 120 "$replay" --fixture "$1" --run ws2 2>&1) || rc=$?
  echo "$out"
  [ "$rc" = "$2" ] || { echo "replay_judges_test: exit $rc, expected $2 for $1" >&2; exit 1; }
  grep -qF -- "$3" <<<"$out" || { echo "replay_judges_test: no '$3' in the output for $1" >&2; exit 1; }
}
run "$fixture" 0 "-> OK"

cp -rL "$fixture" "$tmp/losses"
chmod -R u+w "$tmp/losses"
awk '/"ws2": \{/ { run = 1 } run && /"losses_per_rank"/ { found = 1 }
     found && !done && /^ *-?[0-9]/ { sub(/-?[0-9.e+-]+/, sprintf("%.17g", $1 + 1e-3)); done = 1 } { print }' \
  "$fixture/meta.json" > "$tmp/losses/meta.json"
! cmp -s "$fixture/meta.json" "$tmp/losses/meta.json" || { echo "replay_judges_test: the loss was not changed" >&2; exit 1; }
run "$tmp/losses" 1 "MISMATCH (losses)"

cp -rL "$fixture" "$tmp/weights"
chmod -R u+w "$tmp/weights"
printf '\x00\x00\x80\x3f' | dd of="$tmp/weights/final_ws2.bin" bs=4 count=1 conv=notrunc status=none  # 1.0f
run "$tmp/weights" 1 "MISMATCH (weights)"
echo "replay_judges_test: replay passes the fixture and fails each tampered copy"
