#!/usr/bin/env bash
# cluster.sh start DIR | stop DIR: a one-node Slurm cluster on this machine, from Debian's packages
# (munge, slurmctld, slurmd), everything under DIR: the munge key and socket, slurm.conf, state,
# logs and pid files. `start` returns when the node is idle and prints the SLURM_CONF to export;
# `stop` ends every daemon it started, by pid.
set -euo pipefail
cmd=$1 dir=$(realpath -m "$2")
pids() { cat "$dir"/*.pid 2>/dev/null || true; }

if [ "$cmd" = stop ]; then
    for p in $(pids); do kill "$p" 2>/dev/null || true; done
    for _ in $(seq 50); do
        alive=0
        for p in $(pids); do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && exit 0
        sleep 0.1
    done
    for p in $(pids); do kill -9 "$p" 2>/dev/null || true; done
    exit 0
fi

for tool in munged slurmctld slurmd srun sinfo; do
    command -v $tool >/dev/null || { echo "cluster.sh: $tool is missing (apt-get install munge slurmctld slurmd slurm-client)" >&2; exit 2; }
done
mkdir -p "$dir"/{state,spool,munge}
chmod 700 "$dir/munge"
host=$(hostname -s)
cpus=$(nproc)
# ports of this cluster's own, so that it never meets another
base=$((20000 + $$ % 20000))
dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 600 "$dir/munge/munge.key"
munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" --pid-file="$dir/munged.pid" \
    --log-file="$dir/munged.log" --seed-file="$dir/munge/seed" -f
cat >"$dir/slurm.conf" <<CONF
ClusterName=dpshimtest
SlurmctldHost=$host
SlurmctldPort=$base
SlurmdPort=$((base + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF=$dir/slurm.conf
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 100); do
    if sinfo -h -o %t 2>/dev/null | grep -qx idle; then echo "$SLURM_CONF"; exit 0; fi
    sleep 0.2
done
echo "cluster.sh: the node did not become idle in 20 s; see $dir/slurmctld.log and $dir/slurmd.log" >&2
exit 1
