#!/bin/bash
# ns_rsh.sh HOST COMMAND...: Hydra's rsh-style launcher for cluster.sh. Runs COMMAND on namespace host HOST
# (its network namespace, and a UTS namespace whose hostname is HOST). Options before HOST (as ssh
# launchers receive, e.g. -x) are ignored.
set -uo pipefail
while [[ "${1:-}" == -* ]]; do shift; done
host="${1:?usage: ns_rsh.sh HOST COMMAND...}"; shift
ns="$(awk -v h="$host" '$1 == h { print $2 }' "${DDP_CLUSTER_DIR:?not inside cluster.sh}/map")"
[[ -n "$ns" ]] || { echo "ns_rsh.sh: unknown host '$host' (hosts: $DDP_CLUSTER_HOSTS)" >&2; exit 255; }
# Hydra passes the remote command as one string for a shell, as ssh would.
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
