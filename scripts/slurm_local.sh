#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for testing sweeps with hydra/launcher=slurm (needs root + apt).
#
#   scripts/slurm_local.sh start    # install slurmctld slurmd slurm-client munge if missing, write the config,
#                                   # start munged, slurmctld, slurmd; wait until `sinfo` shows the node idle
#   scripts/slurm_local.sh status   # the daemons this script started, and `sinfo`
#   scripts/slurm_local.sh stop     # stop only the daemons this script started (PIDs recorded at start)
#
# Everything lives under $SLURM_LOCAL_DIR (default /var/lib/slurm-local): state, spool, logs, PID files and
# `started.pids`. The config is /etc/slurm/slurm.conf (so plain sinfo/sbatch/squeue work); an existing slurm.conf not
# written by this script is never overwritten. Configuration: one node with the machine's CPUs and memory (as `slurmd
# -C` reports them), one default partition `local`, ProctrackType=proctrack/linuxproc, TaskPlugin=task/none,
# SelectType=select/cons_tres with CR_Core_Memory, no accounting (`sacct` is unavailable; submitit then warns
# "Bypassing sacct error" and relies on its result files). `start` when the daemons are already up does nothing.
set -euo pipefail

DIR=${SLURM_LOCAL_DIR:-/var/lib/slurm-local}
CONF=/etc/slurm/slurm.conf
MARK="# written by scripts/slurm_local.sh"
PIDS=$DIR/started.pids          # lines "<name> <pid>" for the daemons this script started
HOST=$(hostname -s)
WAIT_S=${SLURM_LOCAL_WAIT_S:-60}

log() { echo "slurm_local: $*"; }
die() { echo "slurm_local: error: $*" >&2; exit 1; }

alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }

# PID of a recorded daemon that is still running (empty if none)
recorded_pid() {
  [ -f "$PIDS" ] || return 0
  local pid
  pid=$(awk -v n="$1" '$1 == n {print $2}' "$PIDS" | tail -n 1)
  if alive "$pid"; then echo "$pid"; fi
}

install_packages() {
  local missing=()
  command -v munged >/dev/null || missing+=(munge)
  command -v slurmctld >/dev/null || missing+=(slurmctld)
  command -v slurmd >/dev/null || missing+=(slurmd)
  command -v sbatch >/dev/null || missing+=(slurm-client)
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || die "apt-get not found; install ${missing[*]} by hand"
  log "installing ${missing[*]}"
  # keep the packages' init scripts from starting daemons we would not track
  local policy_added=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && policy_added=1
  fi
  local rc=0
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >"$DIR/apt.log" 2>&1 ||
    { apt-get update -q >>"$DIR/apt.log" 2>&1 &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$DIR/apt.log" 2>&1; }
  } || rc=$?
  [ $policy_added -eq 1 ] && rm -f /usr/sbin/policy-rc.d
  [ $rc -eq 0 ] || { tail -n 20 "$DIR/apt.log" >&2; die "apt-get install ${missing[*]} failed (log: $DIR/apt.log)"; }
}

write_config() {
  if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    die "$CONF exists and was not written by this script; refusing to overwrite it"
  fi
  mkdir -p /etc/slurm "$DIR/state" "$DIR/spool" "$DIR/log"
  # the node as slurmd detects it: CPUs, sockets/cores/threads, RealMemory (MB)
  local node
  node=$(slurmd -C | head -n 1 | sed -e "s/^NodeName=[^ ]*//")
  [[ "$node" == *CPUs=* && "$node" == *RealMemory=* ]] || die "unexpected 'slurmd -C' output: $node"
  cat > "$CONF.tmp" <<EOF
$MARK (single-node test cluster; state under $DIR)
ClusterName=local
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=3600
NodeName=$HOST NodeAddr=127.0.0.1 $node State=UNKNOWN
PartitionName=local Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
  mv "$CONF.tmp" "$CONF"
}

start_munge() {
  local pid
  pid=$(recorded_pid munged)
  if [ -n "$pid" ]; then return 0; fi
  if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "munged already running (not started by this script; left alone)"
    return 0
  fi
  if [ ! -s /etc/munge/munge.key ]; then
    log "creating /etc/munge/munge.key"
    if command -v mungekey >/dev/null; then mungekey --create --force >/dev/null
    else dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; fi
  fi
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
  for _ in $(seq 50); do [ -s /run/munge/munged.pid ] && break; sleep 0.1; done
  pid=$(cat /run/munge/munged.pid 2>/dev/null || true)
  alive "$pid" || die "munged did not start (see /var/log/munge/munged.log)"
  echo "munged $pid" >> "$PIDS"
}

start_daemon() {  # name, pidfile, command...
  local name=$1 pidfile=$2 pid
  shift 2
  pid=$(recorded_pid "$name")
  if [ -n "$pid" ]; then return 0; fi
  if pid=$(pgrep -x "$name" | head -n 1) && [ -n "$pid" ]; then
    die "$name is already running (pid $pid) but was not started by this script; stop it first"
  fi
  rm -f "$pidfile"
  "$@"
  for _ in $(seq 100); do [ -s "$pidfile" ] && alive "$(cat "$pidfile")" && break; sleep 0.1; done
  pid=$(cat "$pidfile" 2>/dev/null || true)
  alive "$pid" || die "$name did not start (log: $DIR/log/$name.log)"
  echo "$name $pid" >> "$PIDS"
}

node_state() { sinfo -h -N -n "$HOST" -o %T 2>/dev/null | head -n 1; }

cmd_start() {
  [ "$(id -u)" -eq 0 ] || die "must run as root"
  mkdir -p "$DIR"
  if [ -n "$(recorded_pid slurmctld)" ] && [ -n "$(recorded_pid slurmd)" ]; then
    log "already running ($(node_state))"
    return 0
  fi
  install_packages
  write_config
  start_munge
  start_daemon slurmctld "$DIR/slurmctld.pid" slurmctld
  start_daemon slurmd "$DIR/slurmd.pid" slurmd
  local state="" i
  for ((i = 0; i < WAIT_S * 2; i++)); do
    state=$(node_state)
    case "$state" in
      idle|mixed|allocated) break ;;
      drain*|down*|inval*) scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    sleep 0.5
  done
  case "$state" in
    idle|mixed|allocated) log "up: node $HOST $state; $(sinfo -h -o '%P %c CPUs %m MB' | head -n 1)" ;;
    *) sinfo -N -l >&2 || true; tail -n 20 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" >&2 || true
       die "node $HOST not idle after ${WAIT_S}s (state: ${state:-none})" ;;
  esac
}

cmd_stop() {
  if [ ! -f "$PIDS" ]; then log "nothing recorded in $PIDS; nothing to stop"; return 0; fi
  local name pid
  # reverse start order: slurmd, slurmctld, munged
  for name in slurmd slurmctld munged; do
    pid=$(recorded_pid "$name")
    [ -n "$pid" ] || continue
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do alive "$pid" || break; sleep 0.1; done
    if alive "$pid"; then kill -9 "$pid" 2>/dev/null || true; fi
    log "stopped $name ($pid)"
  done
  rm -f "$PIDS"
}

cmd_status() {
  local name pid any=0
  for name in munged slurmctld slurmd; do
    pid=$(recorded_pid "$name")
    if [ -n "$pid" ]; then echo "$name running (pid $pid, started by this script)"; any=1
    else echo "$name not running (from this script)"; fi
  done
  if command -v sinfo >/dev/null && [ $any -eq 1 ]; then sinfo || true; fi
  [ $any -eq 1 ]
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
