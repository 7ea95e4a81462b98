#!/usr/bin/env bash
# tests/cluster/cluster.sh: a Slurm cluster in a box on one Linux machine,
# for the cluster suite (tests/cluster/run.sh) and for users who want to try
# multi-node runs without a cluster (docs/clusters.md).
#
#   tests/cluster/cluster.sh up DIR [NODES]   start it (2 or 3 nodes, default 3)
#   tests/cluster/cluster.sh run DIR CMD...   run a Slurm command (sbatch,
#                                             sinfo, squeue, scontrol) against it
#   tests/cluster/cluster.sh node DIR NODE CMD...  run CMD inside a node
#   tests/cluster/cluster.sh ns DIR NODE      the network namespace of NODE (or ctl)
#   tests/cluster/cluster.sh down DIR         stop everything it started
#
# Needs root (network and UTS namespaces), slurm-wlm and munge. DIR holds
# the configuration, every daemon's log and pid file, and each node's spool
# and /tmp; it must not be under /tmp (a node's /tmp is its own), nor must
# a job's directory. The checkout holding this script may lie anywhere,
# /tmp included: each node sees it at its own path.
#
# What runs where:
#   - munged, with its own key and socket in DIR, in the host's namespaces
#     (a Unix socket: every namespace sees it through the file system).
#   - a network namespace "ctl" holding a bridge and 10.213.0.1, with
#     slurmctld under hostname "ctl"; the Slurm commands run here too.
#   - per node nI: a network namespace with 10.213.0.1I on a veth pair
#     whose other end is on ctl's bridge, and a UTS and mount namespace
#     (hostname nI, /tmp bound to DIR/nodes/nI/tmp, a checkout under /tmp
#     bound back into it), running slurmd.
#     Open MPI names nodes by hostname, so ranks on different "nodes" are
#     different nodes to it and talk over TCP across the bridge; PMIx
#     (srun --mpi=pmix) keeps per-step files in /tmp, which two slurmd
#     sharing one /tmp would collide on.
# The address range exists only inside these namespaces: the host's own
# network is not touched, and two boxes (two DIRs) can run side by side.
#
# `up` waits by progress: it polls sinfo until every node is idle, and
# fails with the daemons' logs when a daemon died or no node came up
# within CLUSTER_UP_TIMEOUT seconds (default 60) of slurmctld answering.
# `down` is safe to run any number of times and after a failed `up`: it
# kills by pid file, then anything left inside the namespaces, deletes the
# namespaces (with their veths and bridge) and removes nothing else.
set -uo pipefail

die() { echo "cluster.sh: $*" >&2; exit 1; }

NET=10.213.0

# Names of this box's namespaces, derived from DIR so that `down` finds
# them again and two boxes never share one.
ns_prefix() { echo "fsdpc$(printf '%s' "$1" | cksum | cut -c1-6)"; }

conf() { # conf DIR NODES: slurm.conf and cgroup.conf
  local dir=$1 nodes=$2 i
  cat >"$dir/slurm.conf" <<CONF
# slurm.conf of the cluster in a box (tests/cluster/cluster.sh)
ClusterName=fsdpbox
MailProg=/bin/true
SlurmctldHost=ctl($NET.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/ctl/state
SlurmctldPidFile=$dir/ctl/slurmctld.pid
SlurmctldLogFile=$dir/ctl/slurmctld.log
SlurmdSpoolDir=$dir/nodes/%n/spool
SlurmdPidFile=$dir/nodes/%n/slurmd.pid
SlurmdLogFile=$dir/nodes/%n/slurmd.log
SlurmdParameters=config_overrides
# Processes are tracked by their parents, no cgroups: the box runs inside
# containers whose cgroup tree it may not own.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=pmix
SchedulerType=sched/backfill
# Schedule at once (a requeued job waits for the next pass otherwise).
SchedulerParameters=bf_interval=1,sched_interval=1,sched_min_interval=100000
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Short timeouts: a node that stops answering is DOWN within seconds and
# its job requeued (JobRequeue, sbatch --requeue).
SlurmdTimeout=6
MessageTimeout=4
KillWait=3
InactiveLimit=0
ReturnToService=2
JobRequeue=1
MinJobAge=3600
# No slurmdbd (it needs a database server): finished jobs are kept by
# slurmctld for MinJobAge and written to the job completion log.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/ctl/jobcomp.log
PartitionName=box Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  for ((i = 1; i <= nodes; i++)); do
    echo "NodeName=n$i NodeAddr=$NET.1$i CPUs=2 RealMemory=1000 State=UNKNOWN" >>"$dir/slurm.conf"
  done
  printf 'CgroupPlugin=autodetect\nIgnoreSystemd=yes\n' >"$dir/cgroup.conf"
}

# The fsdp-lua checkout this script belongs to: jobs run its
# build/bin/fsdp-lua and recipes (FSDP_HOME). A checkout under /tmp would
# be hidden by a node's own /tmp, so it is bound into that /tmp at its own
# path (SHARE); anywhere else the nodes see it as the host does.
CHECKOUT=$(realpath "$(dirname "$0")/../..")
SHARE=""
case "$CHECKOUT" in /tmp/*) SHARE=$CHECKOUT ;; esac

# A node's setup, run by sh inside its new namespaces: the hostname, then
# with TMP the checkout (SHARE) bound onto TMP's copy of its path and TMP,
# that bind included (rbind), bound on /tmp. The mounts are the node's
# alone (--propagation private): the host sees an empty directory in TMP,
# so removing the box's directory never reaches into the checkout.
NODE_SETUP='host=$1 tmp=$2 share=$3; shift 3
hostname "$host" || exit 1
if [ -n "$tmp" ]; then
  if [ -n "$share" ]; then
    mkdir -p "$tmp/${share#/tmp/}" && mount --rbind "$share" "$tmp/${share#/tmp/}" || exit 1
  fi
  mount --rbind "$tmp" /tmp || exit 1
fi
exec "$@"'

# start LOG NETNS HOSTNAME TMP CMD...: CMD in the background inside NETNS,
# in its own UTS namespace named HOSTNAME and, with TMP, its own mount
# namespace with TMP on /tmp (NODE_SETUP). Prints CMD's pid (ip netns
# exec, unshare and sh all exec into it).
start() {
  local log=$1 netns=$2 host=$3 tmp=$4; shift 4
  setsid nsenter --net="/run/netns/$netns" unshare --uts --mount --propagation private \
    sh -c "$NODE_SETUP" sh "$host" "$tmp" "$SHARE" "$@" </dev/null >>"$log" 2>&1 &
  echo $!
}

logs() { # the tail of every daemon log, for a failure report
  local f
  for f in "$1"/munge/munged.log "$1"/ctl/*.log "$1"/ctl/slurmctld.out "$1"/nodes/*/*.log "$1"/nodes/*/slurmd.out; do
    [ -s "$f" ] || continue
    echo "--- $f"
    tail -n 15 "$f"
  done
}

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

up() {
  local dir=$1 nodes=${2:-3} p i
  [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
  case "$dir" in /tmp/*) die "DIR $dir is under /tmp, which each node replaces with its own" ;; esac
  [[ "$nodes" =~ ^[23]$ ]] || die "NODES must be 2 or 3, not $nodes"
  for p in slurmctld slurmd munged sinfo ip unshare; do
    command -v "$p" >/dev/null || die "$p not found (apt-get install slurm-wlm munge iproute2)"
  done
  p=$(ns_prefix "$dir")
  ip netns list | grep -q "^$p-" && die "namespaces $p-* exist: run '$0 down $dir' first"
  mkdir -p "$dir"/munge "$dir"/ctl/state || die "cannot create $dir"
  echo "$nodes" >"$dir/node_count"
  conf "$dir" "$nodes"

  # munge: a key of this box's own; munged refuses keys others can read.
  chmod 755 "$dir/munge"
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 600 "$dir/munge/munge.key"
  munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
    --seed-file="$dir/munge/munged.seed" || { logs "$dir"; die "munged did not start"; }

  # Network: ctl holds the bridge; each node a veth pair onto it.
  ip netns add "$p-ctl" || die "ip netns add failed (no CAP_SYS_ADMIN?)"
  ip -n "$p-ctl" link set lo up
  ip -n "$p-ctl" link add br0 type bridge
  ip -n "$p-ctl" addr add "$NET.1/24" dev br0
  ip -n "$p-ctl" link set br0 up
  for ((i = 1; i <= nodes; i++)); do
    ip netns add "$p-n$i"
    ip -n "$p-n$i" link set lo up
    ip -n "$p-ctl" link add "v$i" type veth peer name eth0 netns "$p-n$i"
    ip -n "$p-ctl" link set "v$i" master br0 up
    ip -n "$p-n$i" addr add "$NET.1$i/24" dev eth0
    ip -n "$p-n$i" link set eth0 up
  done

  export SLURM_CONF=$dir/slurm.conf
  start "$dir/ctl/slurmctld.out" "$p-ctl" ctl "" slurmctld -D -i -f "$SLURM_CONF" >"$dir/ctl/slurmctld.pid"
  for ((i = 1; i <= nodes; i++)); do
    mkdir -p "$dir/nodes/n$i/spool" "$dir/nodes/n$i/tmp"
    chmod 1777 "$dir/nodes/n$i/tmp"
    start "$dir/nodes/n$i/slurmd.out" "$p-n$i" "n$i" "$dir/nodes/n$i/tmp" \
      slurmd -D -N "n$i" -f "$SLURM_CONF" >"$dir/nodes/n$i/slurmd.pid"
  done

  # Progress, not a guess: a daemon that exits fails at once, with the
  # logs; otherwise slurmctld must answer and then every node register,
  # each phase within CLUSTER_UP_TIMEOUT seconds (a loaded machine takes
  # a few seconds for either; a minute means something is wrong).
  local limit=${CLUSTER_UP_TIMEOUT:-60} since=$SECONDS answered="" idle=0 pidf
  while :; do
    for pidf in "$dir"/ctl/slurmctld.pid "$dir"/nodes/*/slurmd.pid; do
      alive "$pidf" || { logs "$dir"; die "${pidf%/*}: daemon $(basename "$pidf" .pid) exited"; }
    done
    if [ -z "$answered" ]; then
      run "$dir" sinfo -h >/dev/null 2>&1 && answered=1 since=$SECONDS
    else
      idle=$(run "$dir" sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)
      [ "$idle" -eq "$nodes" ] && break
    fi
    if ((SECONDS - since > limit)); then
      run "$dir" sinfo -N >&2
      logs "$dir" >&2
      [ -z "$answered" ] && die "slurmctld did not answer within $limit s"
      die "only $idle of $nodes nodes idle $limit s after slurmctld answered"
    fi
    sleep 0.2
  done
}

run() { # run DIR CMD...: CMD in ctl's namespace against this box
  local dir=$1; shift
  SLURM_CONF=$dir/slurm.conf ip netns exec "$(ns_prefix "$dir")-ctl" "$@"
}

node() { # node DIR NODE CMD...
  local dir=$1 n=$2; shift 2
  ip netns exec "$(ns_prefix "$dir")-$n" "$@"
}

down() {
  local dir=$1 p ns pidf pids i
  p=$(ns_prefix "$dir")
  # Daemons by pid file (slurmd first: it ends its job steps), then
  # whatever is still inside the namespaces (job steps, ranks).
  for pidf in "$dir"/nodes/*/slurmd.pid "$dir"/ctl/slurmctld.pid "$dir"/munge/munged.pid; do
    [ -s "$pidf" ] && kill "$(cat "$pidf")" 2>/dev/null
  done
  for ((i = 0; i < 50; i++)); do
    pids=""
    for pidf in "$dir"/nodes/*/slurmd.pid "$dir"/ctl/slurmctld.pid "$dir"/munge/munged.pid; do
      alive "$pidf" && pids+=" $(cat "$pidf")"
    done
    for ns in $(ip netns list | awk -v p="$p-" 'index($1, p) == 1 { print $1 }'); do
      pids+=" $(ip netns pids "$ns" | tr '\n' ' ')"
    done
    [ -z "${pids// /}" ] && break
    # Polite for two seconds, then SIGKILL.
    if ((i < 10)); then kill $pids 2>/dev/null; else kill -9 $pids 2>/dev/null; fi
    sleep 0.2
  done
  [ -z "${pids// /}" ] || echo "cluster.sh: processes$pids did not end" >&2
  for ns in $(ip netns list | awk -v p="$p-" 'index($1, p) == 1 { print $1 }'); do
    ip netns del "$ns" || echo "cluster.sh: could not delete namespace $ns" >&2
  done
  rm -f "$dir"/munge/munge.socket "$dir"/munge/munge.socket.lock
  [ -z "${pids// /}" ]
}

[ $# -ge 2 ] || die "usage: $0 up DIR [NODES] | run DIR CMD... | node DIR NODE CMD... | ns DIR NODE | down DIR"
cmd=$1 dir=$(realpath -m "$2")
shift 2
case "$cmd" in
  up) up "$dir" "$@" ;;
  run) run "$dir" "$@" ;;
  node) node "$dir" "$@" ;;
  ns) echo "$(ns_prefix "$dir")-$1" ;;
  down) down "$dir" ;;
  *) die "unknown command $cmd (up, run, node, ns, down)" ;;
esac
