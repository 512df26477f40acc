#!/usr/bin/env bash
# A real Slurm on the test cluster (called by scripts/cluster.sh up N --slurm, and down):
# munged on this machine, slurmctld on h1 and one slurmd a host, each in its host's
# namespaces, from a generated slurm.conf; every file under DIR/slurm, which down removes.
# No cgroups needed: proctrack/linuxproc, task/none. Debian's packages: slurmd slurmctld
# slurm-client munge, and libpmix-dev for srun --mpi=pmix (the plugin dlopens libpmix.so).
# Each host has a TmpFS of its own (DIR/slurm/tmp/<host>): the PMIx plugin makes its
# client directory spmix_appdir_<uid>_<job>.<step> there on every node of a step, and the
# hosts share one /tmp, where the second node's mkdir failed (EEXIST) and its tasks with it.
#   cluster_slurm.sh up DIR N | down DIR
set -Eeuo pipefail
S=$2/slurm
AGENT=$(cd "$(dirname "$0")" && pwd)/cluster-agent  # enters a host
export ASGD_CLUSTER_DIR=$2

die() { echo "cluster: slurm: $*" >&2; exit 2; }


write_conf() {
    local dir=$1 n=$2 name addr ns
    cat <<EOF
ClusterName=asgd
SlurmctldHost=h1($(awk '$1 == "h1" {print $2}' "$dir/hosts"))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$S/munge.socket
CredType=cred/munge
StateSaveLocation=$S/ctld
SlurmdSpoolDir=$S/spool/%n
TmpFS=$S/tmp/%n
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd-%n.pid
SlurmctldLogFile=$S/slurmctld.log
SlurmdLogFile=$S/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
MessageTimeout=30
EOF
    while read -r name addr ns; do
        echo "NodeName=$name NodeAddr=$addr CPUs=2 State=UNKNOWN"
    done <"$dir/hosts"
    echo "PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
}

up() {
    local dir=$1 n=$2 name addr ns
    for tool in munged slurmctld slurmd sinfo; do
        command -v "$tool" >/dev/null || die "$tool not found (apt-get install slurmd slurmctld slurm-client munge)"
    done
    mkdir -p "$S/ctld"
    while read -r name addr ns; do mkdir -p "$S/spool/$name" "$S/tmp/$name"; done <"$dir/hosts"
    chmod 755 "$S"  # munged: its socket must be reachable by all
    write_conf "$dir" "$n" >"$S/slurm.conf"
    head -c 1024 /dev/urandom >"$S/munge.key"
    chmod 400 "$S/munge.key"
    munged --force --socket="$S/munge.socket" --key-file="$S/munge.key" --pid-file="$S/munged.pid" \
        --log-file="$S/munged.log" --seed-file="$S/munged.seed"
    "$AGENT" h1 slurmctld -f "$S/slurm.conf" -c
    while read -r name addr ns; do
        "$AGENT" "$name" slurmd -f "$S/slurm.conf" -N "$name" -c </dev/null
    done <"$dir/hosts"
    local tries
    for ((tries = 0; tries < 60; tries++)); do
        if [ "$(SLURM_CONF=$S/slurm.conf sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$')" = "$n" ]; then
            touch "$S/up"
            echo "cluster: slurm up: SLURM_CONF=$S/slurm.conf"
            return 0
        fi
        sleep 0.5
    done
    SLURM_CONF=$S/slurm.conf sinfo -N >&2 || true
    die "the nodes did not come up idle in 30 s (logs in $S)"
}

down() {
    # slurmd and slurmctld also end with their hosts (cluster.sh kills what runs in them);
    # munged runs on this machine: its pid file says which.
    local pidfile
    for pidfile in "$S"/slurmd-*.pid "$S/slurmctld.pid" "$S/munged.pid"; do
        [ -f "$pidfile" ] || continue
        local pid; pid=$(cat "$pidfile")
        # the daemon this pid file names, not another process that took its pid since
        grep -qE '^(munged|slurmctld|slurmd)$' "/proc/$pid/comm" 2>/dev/null || continue
        kill -TERM "$pid" 2>/dev/null || true
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
    done
    rm -rf "$S"
}

case "${1:-}" in
    up) up "$2" "$3" ;;
    down) down "$2" ;;
    *) die "usage: cluster_slurm.sh up DIR N | down DIR" ;;
esac
