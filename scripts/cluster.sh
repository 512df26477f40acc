#!/usr/bin/env bash
# A test cluster on one machine (root, iproute2): N hosts h1..hN, each a network
# namespace on a private bridge (its own address and stack, loopback up) entered with a
# UTS namespace of its own (its own hostname); the file system stays shared, as a
# cluster's shared file system is. tests/cluster runs real jobs across it.
#
#   scripts/cluster.sh up N [--slurm]   N hosts (and, with --slurm, munged, slurmctld
#                                       on h1 and one slurmd a host)
#   scripts/cluster.sh down             remove everything `up` made (also on any failure of up)
#   scripts/cluster.sh status           the hosts, or exit 1 when the cluster is down
#
# Then, as with ssh (scripts/cluster-agent enters a host):
#   mpiexec -launcher ssh -launcher-exec scripts/cluster-agent -hosts h1,h2,h3 -n 5 asgd train ...
#   mpirun --mca plm_rsh_agent scripts/cluster-agent --host h1,h2,h3 ...        (Open MPI)
#   SLURM_CONF=$ASGD_CLUSTER_DIR/slurm/slurm.conf sbatch examples/slurm/train.sbatch
# Settings: ASGD_CLUSTER_DIR (its state, default /run/asgd-cluster), ASGD_CLUSTER_PREFIX
# (names of its namespaces and interfaces, default asgd), ASGD_CLUSTER_NET (the /24,
# default 10.231.0: hosts .1..N, the bridge .254). Both `up` and `down` may run twice.
set -Eeuo pipefail
DIR=${ASGD_CLUSTER_DIR:-/run/asgd-cluster}
PREFIX=${ASGD_CLUSTER_PREFIX:-asgd}
NET=${ASGD_CLUSTER_NET:-10.231.0}
BRIDGE=$PREFIX-br
HERE=$(cd "$(dirname "$0")" && pwd)

die() { echo "cluster: $*" >&2; exit 2; }

ns_of() { echo "$PREFIX-h$1"; }

up() {
    local n=$1 slurm=$2
    [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 200)) || die "up: N must be a number of hosts from 1 to 200, not '$n'"
    [ "$(id -u)" = 0 ] || die "up: needs root (network namespaces)"
    command -v ip >/dev/null && ip netns list >/dev/null 2>&1 || die "up: needs iproute2's 'ip netns'"
    if [ -f "$DIR/hosts" ]; then
        local have; have=$(wc -l <"$DIR/hosts")
        if [ "$have" = "$n" ] && [ -f "$DIR/up" ] && { [ "$slurm" = no ] || [ -f "$DIR/slurm/up" ]; }; then
            echo "cluster: already up with $n hosts"
            return 0
        fi
        [ -f "$DIR/up" ] && [ "$have" != "$n" ] && die "up: already up with $have hosts; run down first"
        down  # a half-made cluster (an earlier up that died, or Slurm asked for now)
    fi
    trap 'status=$?; trap - ERR EXIT; echo "cluster: up failed; removing what it made" >&2; down; exit $status' ERR
    mkdir -p "$DIR"
    [ -d /etc/netns ] || { mkdir /etc/netns && touch "$DIR/made-etc-netns"; }
    local i
    for ((i = 1; i <= n; i++)); do echo "h$i $NET.$i $(ns_of "$i")"; done >"$DIR/hosts"
    ip link add "$BRIDGE" type bridge
    ip addr add "$NET.254/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for ((i = 1; i <= n; i++)); do add_host "$i"; done
    touch "$DIR/up"
    [ "$slurm" = no ] || "$HERE/cluster_slurm.sh" up "$DIR" "$n"
    trap - ERR
    echo "cluster: up: hosts h1..h$n on $NET.0/24 (state in $DIR)"
}

add_host() {
    local i=$1 ns; ns=$(ns_of "$1")
    mkdir -p "/etc/netns/$ns"
    {
        echo "127.0.0.1 localhost"
        echo "$NET.254 $(hostname)"  # the machine `up` ran on: where mpiexec and sbatch start
        cut -d' ' -f1,2 "$DIR/hosts" | awk '{print $2, $1}'
    } >"/etc/netns/$ns/hosts"
    mkdir -p "$DIR/boot_ids"  # not in /etc/netns/$ns, whose every file `ip -n` binds over /etc's
    cat /proc/sys/kernel/random/uuid >"$DIR/boot_ids/$ns"  # a machine of its own (scripts/cluster-agent)
    ip netns add "$ns"
    ip link add "$ns-v" type veth peer name eth0 netns "$ns"
    ip link set "$ns-v" master "$BRIDGE" up
    ip -n "$ns" addr add "$NET.$i/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
}

down() {
    trap - ERR
    [ -d "$DIR/slurm" ] && "$HERE/cluster_slurm.sh" down "$DIR"
    local ns
    for ns in $(ip netns list 2>/dev/null | awk -v p="^$PREFIX-h[0-9]+$" '$1 ~ p {print $1}'); do
        kill_in "$ns"
        ip link del "$ns-v" 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
        rm -rf "/etc/netns/$ns"
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    [ -f "$DIR/made-etc-netns" ] && rmdir /etc/netns 2>/dev/null || true
    rm -rf "$DIR"
    echo "cluster: down"
}

kill_in() {
    # Whatever still runs in one of our hosts (a rank a failed job left) is ours: it ends
    # with the host.
    local pids
    pids=$(ip netns pids "$1" 2>/dev/null || true)
    [ -z "$pids" ] && return 0
    kill -TERM $pids 2>/dev/null || true
    sleep 1
    pids=$(ip netns pids "$1" 2>/dev/null || true)
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
}

status() {
    [ -f "$DIR/up" ] || { echo "cluster: down"; return 1; }
    echo "cluster: up (state in $DIR)"
    cat "$DIR/hosts"
    [ -f "$DIR/slurm/up" ] && echo "slurm: SLURM_CONF=$DIR/slurm/slurm.conf"
    return 0
}

case "${1:-}" in
    up)
        [ $# -ge 2 ] || die "usage: cluster.sh up N [--slurm]"
        slurm=no
        [ "${3:-}" = --slurm ] && slurm=yes
        [ $# -le 3 ] && { [ $# -lt 3 ] || [ "$slurm" = yes ]; } || die "usage: cluster.sh up N [--slurm]"
        up "$2" "$slurm" ;;
    down) down ;;
    status) status ;;
    *) die "usage: cluster.sh up N [--slurm] | down | status" ;;
esac
