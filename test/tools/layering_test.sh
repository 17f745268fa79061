#!/usr/bin/env bash
# The layers of include/ddp and what each may include (a header's layer is its first folder under ddp/; error.hpp
# and config.hpp are open to all, ddp.hpp is the umbrella). The rule the comm/ layout rests on: comm knows
# nothing of autograd, models or DDP. tune/ measures and sits above parallel/; nothing in the core, nor the
# umbrella header, includes it. Header comments say what and why: no numbered measurement sessions, issue
# numbers or run counts (those are dated in bench/RESULTS.md and docs/).
# Runs on the headers in its runfiles (//:headers), or on the source tree next to it when run by hand.
set -euo pipefail
root="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-}/include/ddp"
[ -d "$root/comm" ] || root="$(cd "$(dirname "$0")/../../include/ddp" && pwd)"
[ -d "$root/comm" ] || { echo "layering_test: cannot find include/ddp" >&2; exit 1; }
declare -A allowed=(
  [tensor]=""
  [trace]=""
  [autograd]="tensor"
  [comm]="tensor"
  [data]="comm tensor"
  [nn]="autograd comm tensor"
  [optim]="autograd nn tensor"
  [bucket]="autograd comm nn tensor trace"
  [parallel]="autograd bucket comm data nn optim tensor trace"
  [train]="autograd bucket comm data nn optim parallel tensor trace"
  [tune]="autograd bucket comm data nn optim parallel tensor trace"
)
fail=0
checked=0
while IFS= read -r -d '' h; do
  rel="${h#"$root"/}"
  layer="${rel%%/*}"
  [ "$layer" = "$rel" ] && layer="root"
  checked=$((checked + 1))
  while IFS= read -r inc; do
    target="${inc%%/*}"
    [ "$target" = "$inc" ] && continue  # ddp/error.hpp, ddp/config.hpp
    [ "$target" = "$layer" ] && continue
    if [ "$layer" = "root" ]; then
      [ "$target" != "tune" ] && continue
      echo "layering_test: ddp/$rel includes ddp/$inc: the umbrella header leaves out the tuning layer" >&2
      fail=1
      continue
    fi
    [ -n "${allowed[$layer]+x}" ] || { echo "layering_test: ddp/$rel: layer '$layer' is not in the table" >&2; fail=1; break; }
    case " ${allowed[$layer]} " in
      *" $target "*) ;;
      *)
        echo "layering_test: ddp/$rel includes ddp/$inc, but $layer/ may include only: ${allowed[$layer]:-nothing of ddp}" >&2
        fail=1
        ;;
    esac
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]ddp\/\([^">]*\)[">].*/\1/p' "$h")
done < <(find "$root" -name '*.hpp' -print0)
[ "$checked" -gt 50 ] || { echo "layering_test: only $checked headers found under $root" >&2; exit 1; }
if notes=$(grep -rnE '[Ss]ession [0-9]+|[Ii]ssue [0-9]+|[0-9]+ of [0-9]+ runs|in [0-9]+ runs' "$root"); then
  echo "layering_test: header comments cite measurement sessions, issues or run counts (move them to bench/RESULTS.md):" >&2
  echo "$notes" >&2
  fail=1
fi
[ "$fail" = 0 ] || exit 1
echo "layering_test: $checked headers keep to their layers"
