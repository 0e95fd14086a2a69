#!/usr/bin/env bash
# Brings up a real two-node Slurm cluster with accounting on 127.0.0.1, for the tests marked `slurm`.
#
#   scripts/slurm-up.sh [up]    install what is missing, configure, start; a no-op (< 1 s) when already up
#   scripts/slurm-up.sh down    stop every daemon this script started
#   scripts/slurm-up.sh status  daemons, listeners and node states
#
# Needs root on Debian 12 / Ubuntu (apt): slurm-wlm 22.05, slurmdbd, munge, mariadb-server.
# Writes /etc/slurm/slurm.conf and /etc/slurm/slurmdbd.conf (where every Slurm client looks);
# everything else lives in $NEMOTRON_SLURM_DIR (default /tmp/nemotron-slurm).
#
# Why it looks the way it does:
# - two slurmd on one host (`slurmd -N node1|node2`, own ports): the groups of a hetjob never share a
#   node, so a two-group hetjob never starts on a one-node cluster. Hetjobs start only from the backfill
#   scheduler, hence bf_interval=1.
# - a requeued job may start again only once its step credentials expired (AuthInfo cred_expire, 120 s by
#   default: every requeue test waited two minutes in the queue); steps here launch within a second or two.
# - slurmdbd + mariadb: NeMo-Run reads job state with `sacct`, which needs accounting.
# - no systemd here: daemons are started directly; munged runs as the munge user (it refuses root).
# - PID 1 of some sandboxes never reaps orphans, so a killed daemon lingers as a zombie and `kill -0`
#   still succeeds; liveness therefore reads the process state from /proc.
set -euo pipefail

DIR=${NEMOTRON_SLURM_DIR:-/tmp/nemotron-slurm}
CLUSTER=nemotron
PARTITION=debug
NODES=(node1 node2)
CTLD_PORT=6917
DBD_PORT=6919
SLURMD_PORT_BASE=6920          # node i (1-based) listens on SLURMD_PORT_BASE + i
CRED_EXPIRE_S=20               # Slurm's default 120 s is how long a requeued job waits before it may start
DB_PORT=3317                   # not 3306, so a distro mariadb cannot clash
SLURM_CONF=/etc/slurm/slurm.conf
DBD_CONF=/etc/slurm/slurmdbd.conf
DB_DIR=$DIR/mariadb
DB_SOCKET=$DB_DIR/mariadbd.sock
PACKAGES=(slurm-wlm slurmdbd munge mariadb-server)
START=$(date +%s.%N)

log() { printf '[slurm-up +%ss] %s\n' "$(elapsed)" "$*" >&2; }
elapsed() { awk -v a="$START" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
die() { log "ERROR: $*"; exit 1; }
trap 'die "line $LINENO: \`$BASH_COMMAND\` failed"' ERR

# A process is alive when it exists and is not a zombie.
process_alive() { [ -r "/proc/$1/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status"; }
pidfile_alive() { [ -s "$1" ] && process_alive "$(cat "$1")"; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait_until SECONDS DESCRIPTION COMMAND...: poll every 0.1 s.
wait_until() {
  local limit=$1 what=$2 tries
  shift 2
  for ((tries = 0; tries < limit * 10; tries++)); do
    if "$@"; then return 0; fi
    sleep 0.1
  done
  log "timed out after ${limit}s waiting for $what"
  return 1
}

stop_pidfiles() {  # SIGTERM the recorded processes, give them 30 s (mariadb flushes), then SIGKILL
  local pidfile pid pids=()
  for pidfile in "$@"; do
    if pidfile_alive "$pidfile"; then pid=$(cat "$pidfile"); kill "$pid" 2>/dev/null || true; pids+=("$pid"); fi
  done
  any_alive() { local p; for p in "${pids[@]}"; do process_alive "$p" && return 0; done; return 1; }
  if [ ${#pids[@]} -gt 0 ] && ! wait_until 30 "daemons to exit" eval '! any_alive'; then
    for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  fi
  rm -f "$@"
}

slurm_pidfiles() {
  local node
  for node in "${NODES[@]}"; do echo "$DIR/run/slurmd-$node.pid"; done
  echo "$DIR/run/slurmctld.pid" "$DIR/run/slurmdbd.pid"
}

stop_slurm() {
  # slurmd, then slurmctld, then slurmdbd, so each can hand its last records to the next
  local node
  for node in "${NODES[@]}"; do stop_pidfiles "$DIR/run/slurmd-$node.pid"; done
  stop_pidfiles "$DIR/run/slurmctld.pid"
  stop_pidfiles "$DIR/run/slurmdbd.pid"
}

# ------------------------------------------------------------------ config (pure text)
host=$(hostname -s)
# Four one-CPU tasks per node, whatever this host has (slurmd takes the configured count: config_overrides): the Slurm
# tests run on two pytest workers side by side (tests/conftest.py), and rm/serve's test holds 2 tasks on each node.
cpus=$(nproc); [ "$cpus" -ge 4 ] || cpus=4
mem_mb=$(awk '/^MemTotal/ { print int($2 / 1024 / 2) }' /proc/meminfo)  # <= real memory, else DRAIN

render_slurm_conf() {
  local i
  cat <<EOF
# Written by nemotron scripts/slurm-up.sh; edits are overwritten.
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=$CRED_EXPIRE_S
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# containers without cgroup delegation: track processes by /proc, no task binding
ProctrackType=proctrack/linuxproc
SlurmdParameters=config_overrides
TaskPlugin=task/none
PropagateResourceLimits=NONE
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
KillWait=5
MinJobAge=300
InactiveLimit=0
Waittime=0
SlurmctldTimeout=30
SlurmdTimeout=30
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
EOF
  for i in "${!NODES[@]}"; do
    echo "NodeName=${NODES[$i]} NodeHostname=$host NodeAddr=127.0.0.1 Port=$((SLURMD_PORT_BASE + i + 1)) CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN"
  done
  echo "PartitionName=$PARTITION Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP"
}

render_dbd_conf() {
  cat <<EOF
# Written by nemotron scripts/slurm-up.sh; edits are overwritten.
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
# slurmdbd 22.05 has no bind address; NoInAddrAny binds it to what the host name resolves to
CommunicationParameters=NoInAddrAny
SlurmUser=root
DebugLevel=info
LogFile=$DIR/log/slurmdbd.log
PidFile=$DIR/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$(cat "$DB_DIR/slurm.pass")
StorageLoc=slurm_acct_db
EOF
}

# ------------------------------------------------------------------ health
nodes_ready() {  # every node is known and schedulable (idle, mixed or allocated; no * = not responding)
  local states
  states=$(sinfo -h -N -o '%N %t' 2>/dev/null) || return 1
  [ "$(printf '%s\n' "$states" | awk 'NF' | sort -u | wc -l)" -eq "${#NODES[@]}" ] || return 1
  ! printf '%s\n' "$states" | awk '{ print $2 }' | grep -qvE '^(idle|mix|alloc)$'
}
daemons_alive() {
  local pidfile
  for pidfile in $(slurm_pidfiles) "$DB_DIR/mariadbd.pid"; do pidfile_alive "$pidfile" || return 1; done
}
config_current() {
  [ -s "$DB_DIR/slurm.pass" ] && cmp -s <(render_slurm_conf) "$SLURM_CONF" && cmp -s <(render_dbd_conf) "$DBD_CONF"
}
cluster_registered() { sacctmgr -n -P list cluster format=cluster 2>/dev/null | grep -qx "$CLUSTER"; }

# ------------------------------------------------------------------ subcommands
show_status() {
  local pidfile
  for pidfile in $(slurm_pidfiles) "$DB_DIR/mariadbd.pid" /run/munge/munged.pid; do
    printf '%-40s %s\n' "$pidfile" "$(pidfile_alive "$pidfile" && echo up || echo down)"
  done
  if command -v ss >/dev/null; then
    ss -ltnpH 2>/dev/null | grep -E 'slurm|mariadbd|munged' | awk '{ print "listen", $4, $6 }' || true
  fi
  sinfo -N 2>&1 || true
}

case "${1:-up}" in
  up) ;;
  down)
    stop_slurm
    stop_pidfiles "$DB_DIR/mariadbd.pid"
    if [ -e "$DIR/run/munged.ours" ]; then stop_pidfiles /run/munge/munged.pid; rm -f "$DIR/run/munged.ours"; fi
    log "stopped"
    exit 0 ;;
  status) show_status; exit 0 ;;
  *) echo "usage: $0 [up|down|status]" >&2; exit 2 ;;
esac

# ------------------------------------------------------------------ fast path: already up
if command -v slurmctld >/dev/null && config_current && daemons_alive && nodes_ready; then
  log "already up: partition $PARTITION, nodes ${NODES[*]}"
  exit 0
fi

[ "$(id -u)" -eq 0 ] || die "needs root (installs packages, writes /etc/slurm, starts daemons)"

# ------------------------------------------------------------------ 1. packages
missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get"
  log "installing ${missing[*]}"
  # keep postinst scripts from starting distro services (mariadb on 3306, slurm with a default config)
  policy_added=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; policy_added=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [ "$policy_added" -eq 0 ] || rm -f /usr/sbin/policy-rc.d
  log "installed"
fi

# ------------------------------------------------------------------ 2. host, dirs, config
# slurmctld insists on running on SlurmctldHost, and NoInAddrAny binds to what the host name resolves to;
# jobs address each other by node name (SLURM_JOB_NODELIST_HET_GROUP_0=node1), so those must resolve too
for name in "$host" "${NODES[@]}"; do
  getent hosts "$name" >/dev/null || { log "adding $name to /etc/hosts"; echo "127.0.0.1 $name" >> /etc/hosts; }
done
mkdir -p "$DIR"/{state,log,run} /etc/slurm "$DB_DIR"
for node in "${NODES[@]}"; do mkdir -p "$DIR/spool/$node"; done
if [ ! -s "$DB_DIR/slurm.pass" ]; then
  (umask 077; head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' > "$DB_DIR/slurm.pass")
fi
if ! config_current; then
  log "writing $SLURM_CONF and $DBD_CONF (Slurm daemons restart to read them)"
  stop_slurm
  render_slurm_conf > "$SLURM_CONF"; chmod 644 "$SLURM_CONF"
  (umask 077; render_dbd_conf > "$DBD_CONF"); chmod 600 "$DBD_CONF"   # slurmdbd refuses a readable one
fi

# ------------------------------------------------------------------ 3. munge
munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
if [ ! -s /etc/munge/munge.key ]; then
  log "creating the munge key"
  mungekey --create --keyfile=/etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
fi
if ! munge_works; then
  log "starting munged"
  install -d -o munge -g munge -m 755 /run/munge
  runuser -u munge -- /usr/sbin/munged
  touch "$DIR/run/munged.ours"
  wait_until 10 "munged" munge_works || die "munged did not start (see /var/log/munge/munged.log)"
fi

# ------------------------------------------------------------------ 4. mariadb (loopback, own port)
db_sql() { mariadb --no-defaults --socket="$DB_SOCKET" -uroot; }  # SQL on stdin, so no password in ps
db_up() { echo 'SELECT 1' | db_sql >/dev/null 2>&1; }
chown mysql:mysql "$DB_DIR"
if [ ! -d "$DB_DIR/data/mysql" ]; then
  log "initialising mariadb in $DB_DIR/data"
  mariadb-install-db --no-defaults --user=mysql --datadir="$DB_DIR/data" --skip-test-db \
    --auth-root-authentication-method=socket > "$DIR/log/mariadb-install.log" 2>&1 \
    || die "mariadb-install-db failed (see $DIR/log/mariadb-install.log)"
fi
if ! pidfile_alive "$DB_DIR/mariadbd.pid"; then
  log "starting mariadbd on 127.0.0.1:$DB_PORT"
  setsid /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$DB_DIR/data" --socket="$DB_SOCKET" \
    --pid-file="$DB_DIR/mariadbd.pid" --port="$DB_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
    --log-error="$DIR/log/mariadbd.err" --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 \
    </dev/null >/dev/null 2>&1 &
  wait_until 30 "mariadbd" db_up || die "mariadbd did not start (see $DIR/log/mariadbd.err)"
fi
pass=$(cat "$DB_DIR/slurm.pass")
db_sql <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
SQL

# ------------------------------------------------------------------ 5. slurmdbd, slurmctld, slurmd
if ! pidfile_alive "$DIR/run/slurmdbd.pid"; then
  log "starting slurmdbd on 127.0.0.1:$DBD_PORT"
  slurmdbd
  wait_until 30 "slurmdbd" port_open "$DBD_PORT" || die "slurmdbd did not start (see $DIR/log/slurmdbd.log)"
fi
if ! pidfile_alive "$DIR/run/slurmctld.pid"; then
  log "starting slurmctld on 127.0.0.1:$CTLD_PORT"
  slurmctld
fi
ctld_up() { scontrol ping 2>/dev/null | grep -q 'is UP'; }
wait_until 30 "slurmctld" ctld_up || die "slurmctld did not start (see $DIR/log/slurmctld.log)"
for node in "${NODES[@]}"; do
  if ! pidfile_alive "$DIR/run/slurmd-$node.pid"; then log "starting slurmd $node"; slurmd -N "$node"; fi
done
nodes_registered() {  # every slurmd has reported in (no "*" = not responding, no "unk")
  local states
  states=$(sinfo -h -N -o '%t' 2>/dev/null) || return 1
  [ "$(printf '%s\n' "$states" | awk 'NF' | wc -l)" -eq "${#NODES[@]}" ] && ! printf '%s\n' "$states" | grep -qE '\*|^unk'
}
wait_until 30 "slurmd registration" nodes_registered || { sinfo -N -l >&2; die "slurmd not responding (see $DIR/log)"; }
# a node drained or downed by an earlier run (e.g. killed mid-job) stays so until resumed
for node in $(sinfo -h -N -t drain,down,fail -o %N 2>/dev/null | sort -u); do
  log "resuming $node ($(sinfo -h -n "$node" -o %E))"
  scontrol update NodeName="$node" State=RESUME
done
wait_until 15 "idle nodes" nodes_ready || { sinfo -N -l >&2; die "nodes not ready (see $DIR/log)"; }
# slurmctld registers the cluster with slurmdbd on start; until then sacct knows no jobs
wait_until 30 "cluster registration in slurmdbd" cluster_registered \
  || die "cluster $CLUSTER not registered in accounting (see $DIR/log/slurmdbd.log)"
log "up: partition $PARTITION, nodes ${NODES[*]} ($cpus CPUs each), accounting on"
