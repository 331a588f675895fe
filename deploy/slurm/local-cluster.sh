#!/usr/bin/env bash
# A one-machine Slurm cluster on the loopback interface, for trying and testing the job
# scripts beside this file: `up` installs what is missing (Debian's slurm-wlm and munge),
# writes a config under $TANDEM_SLURM_DIR (default /tmp/tandem-slurm) and starts munged,
# slurmctld and slurmd as root, without systemd or cgroups (proctrack/linuxproc, task/none);
# `down` stops them. Commands run against it need `export SLURM_CONF=$TANDEM_SLURM_DIR/slurm.conf`
# (`env` prints it).
set -euo pipefail

dir=${TANDEM_SLURM_DIR:-/tmp/tandem-slurm}
conf=$dir/slurm.conf

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "local-cluster.sh: must run as root (it starts munged, slurmctld and slurmd)" >&2
    exit 1
  fi
}

install_missing() {
  local missing=()
  command -v slurmctld >/dev/null 2>&1 || missing+=(slurm-wlm)
  command -v munged >/dev/null 2>&1 || missing+=(munge)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "local-cluster.sh: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

write_config() {
  mkdir -p "$dir/ctld" "$dir/d" "$dir/munge"
  local cpus memory_mib
  cpus=$(nproc)
  memory_mib=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))
  cat > "$conf" <<CONF
ClusterName=tandem-local
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# A test cluster: pending jobs (dependencies met, requeued tasks) start within seconds rather
# than at the default minute-long scheduling passes and two-minute requeue hold.
SchedulerParameters=sched_interval=2,bf_interval=2
AuthInfo=cred_expire=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MpiDefault=none
ReturnToService=2
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/d
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
MinJobAge=600
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory_mib State=UNKNOWN
PartitionName=local Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
}

start_munge() {
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    chmod 400 /etc/munge/munge.key
  fi
  chown -R munge: /etc/munge 2>/dev/null || true
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge: /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
  local socket=/run/munge/munge.socket.2
  if ! { pgrep -x munged >/dev/null && [ -S "$socket" ]; }; then
    pkill -x munged 2>/dev/null || true
    wait_gone munged
    if id munge >/dev/null 2>&1; then
      su -s /bin/sh munge -c "munged --force" 2>/dev/null || munged --force
    else
      munged --force
    fi
  fi
  for _ in $(seq 1 40); do
    [ -S "$socket" ] && return 0
    sleep 0.25
  done
  echo "local-cluster.sh: munged did not start (no $socket)" >&2
  exit 1
}

# Waits (up to 10 s) until no process has the given name.
wait_gone() {
  for _ in $(seq 1 40); do
    pgrep -x "$1" >/dev/null || return 0
    sleep 0.25
  done
}

wait_for_node() {
  export SLURM_CONF=$conf
  for _ in $(seq 1 60); do
    if sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
      return 0
    fi
    sleep 1
  done
  echo "local-cluster.sh: the node did not come up; logs in $dir" >&2
  sinfo >&2 || true
  tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
  exit 1
}

up() {
  need_root
  install_missing
  write_config
  start_munge
  export SLURM_CONF=$conf
  # A cluster of its own: daemons left from another config are stopped first.
  stop_slurm
  slurmctld -f "$conf" -i
  slurmd -f "$conf" -N localhost
  wait_for_node
  scontrol update nodename=localhost state=resume >/dev/null 2>&1 || true
  echo "slurm is up: export SLURM_CONF=$conf"
}

stop_slurm() {
  pkill -x slurmd 2>/dev/null || true
  pkill -x slurmctld 2>/dev/null || true
  wait_gone slurmd
  wait_gone slurmctld
}

down() {
  stop_slurm
  pkill -x munged 2>/dev/null || true
  wait_gone munged
  rm -rf "$dir"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  env) echo "export SLURM_CONF=$conf" ;;
  *)
    echo "usage: $0 up|down|env" >&2
    exit 2
    ;;
esac
