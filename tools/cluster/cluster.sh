#!/bin/bash
# cluster.sh: a test cluster on one machine. Creates N "hosts" as Linux network namespaces, each with its own
# hostname (a UTS namespace per launched process), joined by veth pairs to a bridge in a switch namespace of
# its own (the root namespace's network is never touched), optionally rate-limited with tc tbf; runs a
# command inside host h0, and tears everything down on exit, failure or signal. Needs root.
#
#   tools/cluster/cluster.sh --hosts N [--rate 1gbit] -- COMMAND [ARGS...]
#
# The command sees DDP_CLUSTER_HOSTS (h0,h1,...) and DDP_CLUSTER_LAUNCHER (an rsh-style launcher for
# Hydra), and typically runs:
#   mpiexec -launcher ssh -launcher-exec "$DDP_CLUSTER_LAUNCHER" -hosts "$DDP_CLUSTER_HOSTS" -ppn 1 -n 2 prog
# tools/cluster/mpiexec.sh does exactly that. Exit status: the command's; 77 when no cluster can be made
# here (not root, no network namespaces), with the reason on stderr; 2 on bad flags.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
usage() { echo "usage: $0 --hosts N [--rate RATE] -- COMMAND [ARGS...]  (N: 2..8; RATE: a tc rate, e.g. 1gbit)" >&2; exit 2; }
hosts=""; rate=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --hosts) [[ $# -ge 2 ]] || usage; hosts="$2"; shift 2 ;;
    --rate) [[ $# -ge 2 ]] || usage; rate="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "cluster.sh: unknown flag '$1'" >&2; usage ;;
  esac
done
[[ "$hosts" =~ ^[0-9]+$ ]] && (( hosts >= 2 && hosts <= 8 )) || { echo "cluster.sh: --hosts must be 2..8, got '$hosts'" >&2; usage; }
[[ $# -ge 1 ]] || { echo "cluster.sh: no command after --" >&2; usage; }
if [[ -n "$rate" && ! "$rate" =~ ^[0-9]+(\.[0-9]+)?([kmg]?bit|[kmg]?bps)$ ]]; then
  echo "cluster.sh: --rate must be a tc rate such as 100mbit or 1gbit, got '$rate'" >&2; exit 2
fi
cannot() { echo "cluster.sh: cannot make a namespace cluster here: $*" >&2; exit 77; }
[[ $(id -u) -eq 0 ]] || cannot "needs root (network namespaces, veth, tc)"
command -v ip >/dev/null || cannot "ip (iproute2) is not installed"
command -v unshare >/dev/null || cannot "unshare (util-linux) is not installed"

# Clusters whose cluster.sh was killed outright (SIGKILL: no trap runs) are removed by the next one.
for stale in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^ddp[0-9]+(sw|h[0-9]+)$'); do
  pid="${stale#ddp}"; pid="${pid%%[sh]*}"
  if ! kill -0 "$pid" 2>/dev/null; then
    ip netns pids "$stale" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$stale" 2>/dev/null
    rm -rf "/etc/netns/$stale" "/tmp/ddp$pid".*
  fi
done
tag="ddp$$"                      # unique per cluster: parallel tests never collide
sw="${tag}sw"
dir="$(mktemp -d "/tmp/${tag}.XXXX")"
names=()
cleanup() {
  for ((i = 0; i < hosts; i++)); do
    ip netns pids "${tag}h$i" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "${tag}h$i" 2>/dev/null
    rm -rf "/etc/netns/${tag}h$i"
  done
  ip netns del "$sw" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip netns add "$sw" 2>/dev/null || cannot "ip netns add failed (no network namespace support, or /run/netns is not writable)"
ip -n "$sw" link add br0 type bridge && ip -n "$sw" link set br0 up && ip -n "$sw" link set lo up || cannot "no bridge"
hosts_file="$dir/hosts"
echo "127.0.0.1 localhost" > "$hosts_file"
for ((i = 0; i < hosts; i++)); do echo "10.77.0.$((i + 1)) h$i" >> "$hosts_file"; done
for ((i = 0; i < hosts; i++)); do
  ns="${tag}h$i"
  ip netns add "$ns" || cannot "ip netns add $ns failed"
  ip link add "${tag}a$i" type veth peer name "${tag}b$i" || cannot "veth pairs are not supported"
  ip link set "${tag}a$i" netns "$ns"
  ip link set "${tag}b$i" netns "$sw"
  ip -n "$ns" link set "${tag}a$i" name eth0
  ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  ip -n "$sw" link set "${tag}b$i" master br0
  ip -n "$sw" link set "${tag}b$i" up
  if [[ -n "$rate" ]]; then
    tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 50ms || cannot "tc tbf failed"
  fi
  mkdir -p "/etc/netns/$ns" && cp "$hosts_file" "/etc/netns/$ns/hosts"  # ip netns exec binds it over /etc/hosts
  echo "h$i $ns" >> "$dir/map"
  names+=("h$i")
done

export DDP_CLUSTER_DIR="$dir"
export DDP_CLUSTER_HOSTS="$(IFS=,; echo "${names[*]}")"
export DDP_CLUSTER_LAUNCHER="$here/ns_rsh.sh"
# MPI between hosts over TCP on eth0 (UCX's shared-memory transports off: the hosts would otherwise find
# each other's memory); ranks on one host keep MPICH's shared memory.
export UCX_TLS="${UCX_TLS:-tcp,self}" UCX_NET_DEVICES="${UCX_NET_DEVICES:-eth0}"
"$here/ns_rsh.sh" h0 "$@" &
child=$!
wait "$child"
rc=$?
for ((i = 0; i < hosts; i++)); do
  echo "cluster.sh: h$i eth0 sent $(ip netns exec "${tag}h$i" cat /sys/class/net/eth0/statistics/tx_bytes) bytes" >&2
done
exit "$rc"
