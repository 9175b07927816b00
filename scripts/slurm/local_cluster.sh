#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for tests/test_slurm.py and for trying the sbatch scripts.
#
#   sudo scripts/slurm/local_cluster.sh up       # install (Debian), start munged, slurmctld, slurmd
#   sudo scripts/slurm/local_cluster.sh status
#   sudo scripts/slurm/local_cluster.sh down     # stop only the daemons that `up` started, by PID
#
# `up` is idempotent: a healthy running cluster (controller answers, this node idle/mixed/allocated) is
# reused as is; only missing pieces are installed or started. It prints one last line,
# "local_cluster: reused" or "local_cluster: started <daemons>".
#
# Exit status: 0 ready; 77 this machine cannot host it (not root, no apt-get) - callers may skip;
# anything else is a real failure (the message names the log to read).
#
# The configuration is the smallest that runs jobs without cgroups, accounting or a database:
# proctrack/linuxproc and task/none (no cgroup v2 delegation needed), no accounting (so no sacct:
# use `scontrol show job` or `sbatch --wait`). cred_expire is short because it is also the time
# a requeued job waits before it may start again (120 s by default). slurmctld starts with -c:
# jobs left over from an earlier session are dropped, not restarted.
set -euo pipefail

STATE=/run/vitlarge-slurm            # pid files of the daemons this script started
CONF=/etc/slurm/slurm.conf
MARK="# written by vitlarge scripts/slurm/local_cluster.sh"
PACKAGES=(slurm-wlm slurmctld slurmd slurm-client munge)
LOG=/var/log/slurm

say() { echo "local_cluster: $*" >&2; }
cannot() { say "$*"; exit 77; }
die() { say "$*"; exit 1; }

node_name() { hostname -s; }

munge_ok() { command -v munge >/dev/null && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
ctld_ok() { scontrol ping 2>/dev/null | grep -q "is UP"; }
node_state() { sinfo -h -N -n "$(node_name)" -o %T 2>/dev/null | head -n1; }
node_ok() { [[ "$(node_state)" =~ ^(idle|mixed|allocated|completing)$ ]]; }
healthy() { munge_ok && ctld_ok && node_ok; }

wait_until() {  # wait_until SECONDS COMMAND...
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

record() {  # record NAME PIDFILE: remember that we started this daemon
  local pid
  wait_until 10 test -s "$2" || die "$1 did not write $2; see $LOG/$1.log"
  pid=$(cat "$2")
  echo "$pid" >"$STATE/$1.pid"
  STARTED+=("$1")
}

install_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  command -v apt-get >/dev/null || cannot "Slurm is not installed and there is no apt-get to install ${missing[*]}"
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Debian's maintainer scripts must not start the daemons: we start them ourselves, configured.
  local policy=/usr/sbin/policy-rc.d own_policy=0
  if [[ ! -e $policy ]]; then printf '#!/bin/sh\nexit 101\n' >$policy && chmod +x $policy && own_policy=1; fi
  { apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/vitlarge-slurm-apt.log 2>&1 ||
    { apt-get update -qq >>/tmp/vitlarge-slurm-apt.log 2>&1 &&
      apt-get install -y -qq --no-install-recommends "${missing[@]}" >>/tmp/vitlarge-slurm-apt.log 2>&1; }; } ||
    { ((own_policy)) && rm -f $policy; die "apt-get install ${missing[*]} failed; see /tmp/vitlarge-slurm-apt.log"; }
  ((own_policy)) && rm -f $policy
  return 0
}

start_munge() {
  munge_ok && return 0
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
  [[ -s /etc/munge/munge.key ]] || die "/etc/munge/munge.key is missing; reinstall munge (it creates the key)"
  rm -f /run/munge/munged.pid
  runuser -u munge -- /usr/sbin/munged --force || die "munged did not start; see /var/log/munge/munged.log"
  record munged /run/munge/munged.pid
  wait_until 10 munge_ok || die "munged started but munge -n | unmunge fails; see /var/log/munge/munged.log"
}

write_conf() {
  if [[ -e $CONF ]] && ! grep -qF "$MARK" "$CONF"; then
    die "$CONF exists and was not written by this script; move it away to use the local test cluster"
  fi
  local node hw
  node=$(node_name)
  hw=$(slurmd -C | head -n1 | sed "s/^NodeName=[^ ]*//")  # CPUs=2 Boards=1 ... RealMemory=...
  mkdir -p /etc/slurm "$LOG"
  cat >"$CONF.tmp" <<EOF
$MARK: a single-node test cluster.
ClusterName=vitlarge-local
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=30
MinJobAge=600
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=$STATE/slurmctld.daemon.pid
SlurmdPidFile=$STATE/slurmd.daemon.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
NodeName=$node NodeAddr=127.0.0.1$hw State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
  if ! cmp -s "$CONF.tmp" "$CONF"; then mv "$CONF.tmp" "$CONF"; else rm -f "$CONF.tmp"; fi
}

start_slurm() {
  if ! ctld_ok; then
    rm -f "$STATE/slurmctld.daemon.pid"
    slurmctld -c || die "slurmctld did not start; see $LOG/slurmctld.log"
    record slurmctld "$STATE/slurmctld.daemon.pid"
    wait_until 20 ctld_ok || die "slurmctld does not answer scontrol ping; see $LOG/slurmctld.log"
  fi
  local pid
  pid=$(cat "$STATE/slurmd.daemon.pid" 2>/dev/null || true)
  if [[ -z $pid ]] || ! kill -0 "$pid" 2>/dev/null; then
    rm -f "$STATE/slurmd.daemon.pid"
    slurmd || die "slurmd did not start; see $LOG/slurmd.log"
    record slurmd "$STATE/slurmd.daemon.pid"
  fi
  if ! wait_until 30 node_ok; then
    # A node that was down (e.g. slurmd killed earlier) returns to service on registration
    # (ReturnToService=2); one that was drained by hand needs an explicit resume.
    scontrol update nodename="$(node_name)" state=resume 2>/dev/null || true
    wait_until 10 node_ok || die "node $(node_name) is '$(node_state)', not idle; see $LOG/slurmd.log and $LOG/slurmctld.log"
  fi
}

up() {
  [[ $(id -u) == 0 ]] || cannot "needs root (installs packages, starts munged/slurmctld/slurmd); run with sudo"
  mkdir -p "$STATE"
  if command -v scontrol >/dev/null && healthy; then
    say "reused"
    return 0
  fi
  STARTED=()
  install_packages
  start_munge
  ctld_ok || write_conf
  start_slurm
  say "started ${STARTED[*]:-nothing (all daemons were already running)}"
}

stop_pid() {  # stop_pid NAME: TERM, wait, then KILL the PID we recorded, if it is still that daemon
  local file=$STATE/$1.pid pid
  [[ -s $file ]] || return 0
  pid=$(cat "$file")
  if [[ "$(cat /proc/"$pid"/comm 2>/dev/null)" == "$1" ]]; then
    kill -TERM "$pid" 2>/dev/null || true
    wait_until 15 bash -c "! kill -0 $pid 2>/dev/null" || kill -KILL "$pid" 2>/dev/null || true
    say "stopped $1 ($pid)"
  fi
  rm -f "$file"
}

down() {
  [[ $(id -u) == 0 ]] || cannot "needs root"
  stop_pid slurmd
  stop_pid slurmctld
  stop_pid munged
}

status() {
  if healthy; then
    sinfo
    return 0
  fi
  say "not healthy: munge $(munge_ok && echo ok || echo down), slurmctld $(ctld_ok && echo up || echo down), node '$(node_state)'"
  return 1
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
