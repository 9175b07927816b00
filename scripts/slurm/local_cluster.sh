#!/usr/bin/env bash
# A Slurm cluster on this machine, for tests/e2e/test_slurm*.py and for trying the sbatch scripts.
#
#   sudo scripts/slurm/local_cluster.sh up       # install (Debian), start munged, slurmctld, slurmd
#   sudo scripts/slurm/local_cluster.sh up --nodes 2   # two nodes, each in its own network namespace
#   sudo scripts/slurm/local_cluster.sh status
#   sudo scripts/slurm/local_cluster.sh down     # stop only the daemons that `up` started, by PID;
#                                                # remove the namespaces and interfaces it made
#   sudo scripts/slurm/local_cluster.sh crash vlnode2  # a node of a multi-node cluster fails: kill -9 of
#                                                # every process in its namespace (slurmd, slurmstepd,
#                                                # tasks); slurmctld marks it down after SlurmdTimeout;
#                                                # `up --nodes N` starts it again (ReturnToService=2)
#
# `up` is idempotent: a healthy running cluster of the requested shape (controller answers, every node
# idle/mixed/allocated) is reused as is; only missing pieces are installed or started. A cluster of
# another shape (1 node where 2 are asked, or the reverse) is stopped and started again in the
# requested one. It prints one last line, "local_cluster: reused" or "local_cluster: started <daemons>".
#
# Several nodes (--nodes N, 2..8): node vlnodeI runs its slurmd in network namespace vlnodeI (address
# 10.213.0.(1+I) on its eth0, a veth pair to bridge vlbr0 = 10.213.0.1 in the host namespace) and in
# its own UTS and mount namespaces (hostname vlnodeI; $STATE/hosts bind-mounted on /etc/hosts, so the
# node names resolve inside the nodes and nowhere else). slurmctld stays in the host namespace and
# listens on 10.213.0.1. The file system is shared: it stands in for a cluster's shared file system.
# Debian's slurmd (built without --enable-multiple-slurmd) runs one slurmd per node name: the one
# check that build adds, a NodeHostname used twice, does not apply (each node has its own), -N and
# the %n in the spool, pid and log paths work in every build, and each slurmd listens on port 6818 in
# its own network namespace.
#
# Exit status: 0 ready; 77 this machine cannot host it (not root, no apt-get) - callers may skip;
# anything else is a real failure (the message names the log to read).
#
# The configuration is the smallest that runs jobs without cgroups, accounting or a database:
# proctrack/linuxproc and task/none (no cgroup v2 delegation needed), no accounting (so no sacct:
# use `scontrol show job` or `sbatch --wait`). cred_expire is short because it is also the time
# a requeued job waits before it may start again (120 s by default). SlurmdTimeout is 30 s (300 by
# default): a crashed node is marked down, and its jobs requeued, within a test's time. slurmctld starts with -c:
# jobs left over from an earlier session are dropped, not restarted.
set -euo pipefail

STATE=/run/vitlarge-slurm            # pid files of the daemons this script started
CONF=/etc/slurm/slurm.conf
MARK="# written by vitlarge scripts/slurm/local_cluster.sh"
PACKAGES=(slurm-wlm slurmctld slurmd slurm-client munge)
LOG=/var/log/slurm
NODES=1                              # --nodes
NET=10.213.0                         # the /24 of the multi-node cluster: bridge .1, node I .(1+I)
BRIDGE=vlbr0

say() { echo "local_cluster: $*" >&2; }
cannot() { say "$*"; exit 77; }
die() { say "$*"; exit 1; }

node_name() { hostname -s; }
node_names() { if ((NODES == 1)); then node_name; else for ((i = 1; i <= NODES; i++)); do echo "vlnode$i"; done; fi; }
running_nodes() { cat "$STATE/nodes" 2>/dev/null || echo 1; }  # the shape of the cluster last started

munge_ok() { command -v munge >/dev/null && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
ctld_ok() { scontrol ping 2>/dev/null | grep -q "is UP"; }
node_state() { sinfo -h -N -n "${1:-$(node_name)}" -o %T 2>/dev/null | head -n1; }
node_ok() { [[ "$(node_state "${1:-}")" =~ ^(idle|mixed|allocated|completing)$ ]]; }
nodes_ok() { local n; for n in $(node_names); do node_ok "$n" || return 1; done; }
healthy() { [[ $(running_nodes) == "$NODES" ]] && munge_ok && ctld_ok && nodes_ok; }

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
  local node hw ctl_addr=127.0.0.1 spool=slurmd pidfile=slurmd nodes
  node=$(node_name)
  hw=$(slurmd -C | head -n1 | sed "s/^NodeName=[^ ]*//")  # CPUs=2 Boards=1 ... RealMemory=...
  nodes="NodeName=$node NodeAddr=127.0.0.1$hw State=UNKNOWN"
  if ((NODES > 1)); then
    ctl_addr=$NET.1 spool=slurmd-%n pidfile=slurmd-%n nodes=""
    for ((i = 1; i <= NODES; i++)); do nodes+="NodeName=vlnode$i NodeAddr=$NET.$((1 + i))$hw State=UNKNOWN"$'\n'; done
  fi
  mkdir -p /etc/slurm "$LOG"
  cat >"$CONF.tmp" <<EOF
$MARK: a $NODES-node test cluster.
ClusterName=vitlarge-local
SlurmctldHost=$node($ctl_addr)
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
SlurmdTimeout=30
KillWait=30
MinJobAge=600
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/$spool
SlurmctldPidFile=$STATE/slurmctld.daemon.pid
SlurmdPidFile=$STATE/$pidfile.daemon.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/$spool.log
${nodes%$'\n'}
PartitionName=local Nodes=$(node_names | paste -sd,) Default=YES MaxTime=INFINITE State=UP
EOF
  if ! cmp -s "$CONF.tmp" "$CONF"; then mv "$CONF.tmp" "$CONF"; else rm -f "$CONF.tmp"; fi
}

net_ok() {  # the namespaces, bridge and veth pairs of a NODES-node cluster are there
  ip link show "$BRIDGE" >/dev/null 2>&1 || return 1
  local i; for ((i = 1; i <= NODES; i++)); do ip netns exec "vlnode$i" ip -4 addr show eth0 2>/dev/null | grep -q "$NET.$((1 + i))/" || return 1; done
}

start_net() {  # bridge vlbr0 = NET.1 in the host namespace; netns vlnodeI with eth0 = NET.(1+I) on it
  command -v ip >/dev/null && command -v unshare >/dev/null && command -v nsenter >/dev/null ||
    cannot "--nodes $NODES needs iproute2 (ip netns), unshare and nsenter (util-linux)"
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    if ip -4 addr | grep -q " $NET\\."; then cannot "$NET.0/24 is already used on this machine; cannot make the test network"; fi
    # A network reached through a gateway is not a local address, but vlbr0's connected /24 would take it
    # over for the whole run (NFS or CI hosts there would become unreachable): any route other than the
    # default one that covers $NET.2 means the subnet is in use.
    local routed; routed=$(ip -4 route show match "$NET.2" 2>/dev/null | grep -v '^default' || true)
    [[ -z $routed ]] || cannot "$NET.0/24 is routed on this machine ($routed); cannot make the test network"
    ip link add "$BRIDGE" type bridge 2>/dev/null || cannot "cannot create a bridge (ip link add $BRIDGE type bridge); needs CAP_NET_ADMIN"
    echo "bridge $BRIDGE" >>"$STATE/made"
    # br_netfilter (Docker hosts) would pass bridged frames through iptables, where FORWARD DROP eats them.
    ip link set "$BRIDGE" type bridge nf_call_iptables 0 nf_call_ip6tables 0 2>/dev/null || true
    ip addr add "$NET.1/24" dev "$BRIDGE" && ip link set "$BRIDGE" up || die "cannot configure $BRIDGE"
  fi
  {
    echo "127.0.0.1 localhost"
    echo "$NET.1 $(node_name)"
    for ((i = 1; i <= NODES; i++)); do echo "$NET.$((1 + i)) vlnode$i"; done
  } >"$STATE/hosts"
  local i ns
  for ((i = 1; i <= NODES; i++)); do
    ns=vlnode$i
    if ! ip netns exec "$ns" true 2>/dev/null; then
      ip netns add "$ns" 2>/dev/null || cannot "cannot create network namespace $ns (ip netns add); needs CAP_SYS_ADMIN"
      echo "netns $ns" >>"$STATE/made"
    fi
    if ! ip netns exec "$ns" ip link show eth0 >/dev/null 2>&1; then
      ip link del "vlh$i" 2>/dev/null || true
      ip link add "vlh$i" type veth peer name eth0 netns "$ns" || die "cannot create veth pair vlh$i/$ns:eth0"
      echo "veth vlh$i" >>"$STATE/made"
      ip link set "vlh$i" master "$BRIDGE" && ip link set "vlh$i" up || die "cannot attach vlh$i to $BRIDGE"
      ip netns exec "$ns" ip addr add "$NET.$((1 + i))/24" dev eth0 &&
        ip netns exec "$ns" ip link set eth0 up && ip netns exec "$ns" ip link set lo up || die "cannot configure eth0 in $ns"
    fi
  done
  wait_until 10 net_ok || die "the test network did not come up (ip netns exec vlnode1 ip addr)"
}

stop_net() {  # removes what start_net recorded in $STATE/made, nothing else: namespaces, veth pairs, the bridge
  local kind name pids
  if [[ -s $STATE/made ]]; then
    # Namespaces first: processes still inside one (slurmstepd and its tasks outlive slurmd by KillWait)
    # would keep it alive after `ip netns del`. Wait for them (bounded), then stop them.
    while read -r kind name; do
      [[ $kind == netns ]] || continue
      ip netns list 2>/dev/null | grep -qw "^$name" || continue
      if ! wait_until 20 bash -c "[[ -z \$(ip netns pids $name 2>/dev/null) ]]"; then
        pids=$(ip netns pids "$name" 2>/dev/null | tr '\n' ' ')
        say "stopping processes still in $name: $pids"
        kill -KILL $pids 2>/dev/null || true
      fi
      ip netns del "$name" && say "removed network namespace $name"
    done <"$STATE/made"
    while read -r kind name; do
      [[ -n $name ]] || { name=$kind; kind=bridge; }  # older state files listed the bridge alone
      case $kind in
        veth) ip link del "$name" 2>/dev/null || true ;;  # usually gone with its namespace
        bridge) if ip link show "$name" >/dev/null 2>&1; then ip link del "$name" && say "removed bridge $name"; fi ;;
      esac
    done <"$STATE/made"
  fi
  rm -f "$STATE/hosts" "$STATE/made"
}

probe_failed() { stop_slurm; stop_net; cannot "$1"; }  # leave nothing half made behind

net_probe() {  # bounded TCP probes: every node -> the controller's port, node 1 -> every other node's slurmd
  local i port
  port=$(sed -n 's/^SlurmctldPort=//p' "$CONF" 2>/dev/null); port=${port:-6817}
  for ((i = 1; i <= NODES; i++)); do
    nsenter --net="/run/netns/vlnode$i" timeout 5 bash -c "exec 3<>/dev/tcp/$NET.1/$port" 2>/dev/null ||
      probe_failed "vlnode$i cannot open TCP $NET.1:$port (slurmctld) over $BRIDGE: a firewall drops it (host INPUT rules, or br_netfilter with iptables FORWARD DROP, e.g. Docker); allow $NET.0/24 or run elsewhere"
    ((i == 1)) && continue
    nsenter --net=/run/netns/vlnode1 timeout 5 bash -c "exec 3<>/dev/tcp/$NET.$((1 + i))/6818" 2>/dev/null ||
      probe_failed "vlnode1 cannot open TCP $NET.$((1 + i)):6818 (slurmd of vlnode$i) over $BRIDGE: bridged traffic is dropped (br_netfilter with iptables FORWARD DROP, e.g. Docker); allow it or run elsewhere"
  done
}

start_slurmd() {  # start_slurmd NODE: one slurmd, in the host namespace (1 node) or in the node's namespaces
  local pid pidfile=$STATE/slurmd.daemon.pid name=slurmd
  ((NODES > 1)) && pidfile=$STATE/slurmd-$1.daemon.pid name=slurmd-$1
  pid=$(cat "$pidfile" 2>/dev/null || true)
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null && return 0
  rm -f "$pidfile"
  if ((NODES == 1)); then
    slurmd || die "slurmd did not start; see $LOG/slurmd.log"
  else
    mkdir -p "/var/lib/slurm/slurmd-$1"
    # nsenter: the network namespace (not `ip netns exec`, which remounts /sys and so hides the
    # cgroup mounts slurmd needs); unshare: the hostname and a private /etc/hosts.
    nsenter --net="/run/netns/$1" unshare --uts --mount --propagation private \
      bash -c 'hostname "$1" && mount --bind "$2" /etc/hosts && exec slurmd -N "$1"' _ "$1" "$STATE/hosts" ||
      die "slurmd for $1 did not start; see $LOG/slurmd-$1.log"
  fi
  wait_until 10 test -s "$pidfile" || die "$name did not write $pidfile; see $LOG/$name.log"
  echo "$(cat "$pidfile")" >"$STATE/$name.pid"
  STARTED+=("$name")
}

start_slurm() {
  if ! ctld_ok; then
    rm -f "$STATE/slurmctld.daemon.pid"
    slurmctld -c || die "slurmctld did not start; see $LOG/slurmctld.log"
    record slurmctld "$STATE/slurmctld.daemon.pid"
    wait_until 20 ctld_ok || die "slurmctld does not answer scontrol ping; see $LOG/slurmctld.log"
  fi
  local n
  for n in $(node_names); do start_slurmd "$n"; done
  if ((NODES > 1)); then net_probe; fi
  if ! wait_until 30 nodes_ok; then
    # A node that was down (e.g. slurmd killed earlier) returns to service on registration
    # (ReturnToService=2); one that was drained by hand needs an explicit resume.
    for n in $(node_names); do node_ok "$n" || scontrol update nodename="$n" state=resume 2>/dev/null || true; done
    for n in $(node_names); do
      wait_until 10 node_ok "$n" || die "node $n is '$(node_state "$n")', not idle; see $LOG/slurmd*.log and $LOG/slurmctld.log"
    done
  fi
}

up() {
  [[ $(id -u) == 0 ]] || cannot "needs root (installs packages, starts munged/slurmctld/slurmd); run with sudo"
  mkdir -p "$STATE"
  if command -v scontrol >/dev/null && healthy && { ((NODES == 1)) || net_ok; }; then
    if ((NODES == 1)); then stop_net; fi  # leftovers of a multi-node cluster; the one node does not use them
    say "reused"
    return 0
  fi
  if [[ $(running_nodes) != "$NODES" ]]; then stop_slurm; fi  # another shape: restart in this one
  if ((NODES == 1)); then stop_net; fi
  STARTED=()
  install_packages
  start_munge
  if ((NODES > 1)); then start_net; fi
  if ! ctld_ok; then write_conf; fi
  echo "$NODES" >"$STATE/nodes"
  start_slurm
  say "started ${STARTED[*]:-nothing (all daemons were already running)}"
}

stop_pid() {  # stop_pid NAME: TERM, wait, then KILL the PID we recorded, if it is still that daemon
  local file=$STATE/$1.pid pid
  [[ -s $file ]] || return 0
  pid=$(cat "$file")
  if [[ "$(cat /proc/"$pid"/comm 2>/dev/null)" == "${1%%-*}" ]]; then
    kill -TERM "$pid" 2>/dev/null || true
    wait_until 15 bash -c "! kill -0 $pid 2>/dev/null" || kill -KILL "$pid" 2>/dev/null || true
    say "stopped $1 ($pid)"
  fi
  rm -f "$file"
}

stop_slurm() {  # every slurmd and slurmctld we started (either shape), not munged
  local f
  for f in "$STATE"/slurmd*.pid; do [[ -e $f && $f != *.daemon.pid ]] && stop_pid "$(basename "$f" .pid)"; done
  stop_pid slurmctld
  rm -f "$STATE/nodes"
}

down() {
  [[ $(id -u) == 0 ]] || cannot "needs root"
  stop_slurm
  stop_pid munged
  stop_net
}

status() {
  NODES=$(running_nodes)
  if healthy && { ((NODES == 1)) || net_ok; }; then
    sinfo -N -o "%N %T %o"
    ((NODES == 1)) || ip netns list | grep vlnode
    return 0
  fi
  say "not healthy ($NODES node(s)): munge $(munge_ok && echo ok || echo down), slurmctld $(ctld_ok && echo up || echo down), nodes:$(for n in $(node_names); do printf " %s '%s'" "$n" "$(node_state "$n")"; done)"
  return 1
}

crash() {  # crash NODE: the node dies at once, as a power loss would; its namespaces stay for `up` to reuse
  [[ $(id -u) == 0 ]] || cannot "needs root"
  [[ $1 =~ ^vlnode[1-8]$ ]] && ip netns list 2>/dev/null | grep -qw "^$1" ||
    die "crash: $1 is not a node of the running multi-node cluster (vlnode1..vlnode$(running_nodes))"
  local pids
  pids=$(ip netns pids "$1" | tr '\n' ' ')
  [[ -n ${pids// /} ]] || die "crash: nothing runs on $1"
  kill -KILL $pids 2>/dev/null || true
  say "crashed $1: killed $pids"
}

USAGE="usage: $0 up [--nodes N]|down|status|crash NODE"
cmd=${1:-}
shift || true
node=""
if [[ $cmd == crash ]]; then node=${1:-}; shift || true; fi
while (($#)); do
  case $1 in
    --nodes) NODES=${2:-}; shift 2 || true ;;
    --nodes=*) NODES=${1#--nodes=}; shift ;;
    *) echo "$USAGE" >&2; exit 2 ;;
  esac
done
[[ $NODES =~ ^[1-8]$ ]] || { echo "local_cluster: --nodes must be 1..8, got '$NODES'" >&2; exit 2; }

case "$cmd" in
  up) up ;;
  down) down ;;
  status) status ;;
  crash) crash "$node" ;;
  *) echo "$USAGE" >&2; exit 2 ;;
esac
