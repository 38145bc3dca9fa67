#!/usr/bin/env bash
# make slurm-check  (= bash experiments/slurm_check.sh): a sweep through a real SLURM controller, end to end.
#   1. A cluster: the one `sinfo` already answers for (yours: SLURM_CONF or /etc/slurm/slurm.conf), else a
#      single-node SLURM on this machine: Debian's slurm-wlm and munge, and slurmdbd on a local MariaDB (submitit
#      reads job states with sacct), installed with apt-get (as root) when missing; a munge key; slurm.conf and
#      slurmdbd.conf generated for localhost under $SLURM_CHECK_DIR/cluster; munged, mariadb, slurmdbd, slurmctld
#      and slurmd started from there (stopped again at the end unless SLURM_CHECK_KEEP=1).
#   2. A sweep through hydra/launcher=slurm (hydra-submitit-launcher): model=tiny, $SLURM_CHECK_DECODERS on a
#      small local prompt file, one SLURM job per run, submitted as one job array.
#   3. While the array runs, one running job is cancelled with scancel: the sweep ends without its row.
#   4. The same sweep again: exactly the cancelled run's row appears (the others are skipped by config hash),
#      and every line of the results file parses as a result row.
#   Exit status 0 only when all of that holds. On your own cluster: SLURM_CHECK_PARTITION=<partition> (and
#   SLURM_CHECK_ACCOUNT=<account> where one is required); the output folder must be on a filesystem the compute
#   nodes share (SLURM_CHECK_DIR, default results/slurm-check/, under the checkout).
# Environment: PY (default .venv/bin/python), SLURM_CHECK_DIR, SLURM_CHECK_PARTITION, SLURM_CHECK_ACCOUNT,
# SLURM_CHECK_DECODERS (default greedy,sampling,speculative,mtad), SLURM_CHECK_KEEP=1 (leave a local cluster up).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
case "${1:-}" in -h|--help) sed -n '2,21p' "$0"; exit 0 ;; "") ;; *) echo "slurm-check: no arguments (see --help)" >&2; exit 2 ;; esac

if [ -z "${PY:-}" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
DIR=$(mkdir -p "${SLURM_CHECK_DIR:-results/slurm-check}" && cd "${SLURM_CHECK_DIR:-results/slurm-check}" && pwd)
DECODERS=${SLURM_CHECK_DECODERS:-greedy,sampling,speculative,mtad}
N_RUNS=$(awk -F, '{print NF}' <<<"$DECODERS")
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the jobs import this checkout's mtad (sbatch exports the env)
export HF_HUB_OFFLINE=1 WANDB_MODE=disabled PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
LOG="$DIR/slurm_check.log"
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1
say() { echo "slurm-check: $*"; }
fail() { say "FAILED: $*"; exit 1; }
START=$(date +%s)

# ---- 1. a cluster ------------------------------------------------------------------------------------------
STARTED=()  # pid files of the daemons this script started
STARTED_DB=0
stop_local() {
    local i
    set +e  # best effort: a daemon or the sweep may be gone already
    [ -n "${SWEEP_PID:-}" ] && kill "$SWEEP_PID" 2>/dev/null
    [ -n "${JOB_NAME:-}" ] && [ -n "$(squeue -h -n "$JOB_NAME" 2>/dev/null)" ] && scancel -n "$JOB_NAME" && sleep 3
    for ((i = ${#STARTED[@]} - 1; i >= 0; i--)); do  # slurmd, slurmctld, then slurmdbd
        [ -s "${STARTED[$i]}" ] && kill "$(cat "${STARTED[$i]}")" 2>/dev/null || true
    done
    if [ "$STARTED_DB" = 1 ]; then mysqladmin shutdown 2>/dev/null; fi
    return 0
}
free_ports() {  # N distinct free TCP ports on localhost
    "$PY" - "$1" <<'PYEOF'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PYEOF
}
alive() {  # PIDFILE NAME LOG [WAIT]: the daemon we started is running (it wrote its pid file), else fail
    local i pid
    for i in $(seq "${4:-10}"); do [ -s "$1" ] && break; sleep 1; done
    pid=$(cat "$1" 2>/dev/null || true)
    if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
        tail -n 5 "$3" 2>/dev/null | sed "s/^/  $2 log| /"
        fail "$2 started by this check is not running (log: $3)"
    fi
}
cluster_name() { scontrol show config 2>/dev/null | awk -F' *= *' '$1 == "ClusterName" {print $2}'; }
ours() { [ "$(cluster_name)" = mtadcheck ]; }
start_local() {
    if ! command -v sbatch >/dev/null || ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
        [ "$(id -u)" = 0 ] || fail "sbatch/slurmctld/munged missing and not root: install slurm-wlm and munge"
        say "installing slurm-wlm and munge (apt-get)"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
    fi
    if ! command -v slurmdbd >/dev/null || ! command -v mysqld_safe >/dev/null; then
        [ "$(id -u)" = 0 ] || fail "slurmdbd/mariadb missing and not root: install slurmdbd and mariadb-server"
        say "installing slurmdbd and mariadb-server (apt-get): submitit reads job states with sacct"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmdbd mariadb-server >/dev/null
    fi
    [ "$(id -u)" = 0 ] || fail "starting a local SLURM needs root (slurmd runs jobs as their user)"
    local conf="$DIR/cluster" cpus mem ctld_port slurmd_port dbd_port
    # free ports for our daemons: another SLURM (or anything) on the default 6817-6819 would make ours die at
    # start while `sinfo` went on answering for the other one
    read -r ctld_port slurmd_port dbd_port < <(free_ports 3)
    rm -rf "$conf"  # a fresh controller: no jobs left over from an earlier, interrupted check
    mkdir -p "$conf/state" "$conf/spool" "$conf/log" /run/munge /var/log/munge /var/lib/munge
    if [ ! -s /etc/munge/munge.key ]; then
        say "creating a munge key"
        mkdir -p /etc/munge
        if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key
        else dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none; fi
    fi
    chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
    chmod 0700 /etc/munge && chmod 0400 /etc/munge/munge.key
    if ! munge -n </dev/null >/dev/null 2>&1; then
        say "starting munged"
        if id munge >/dev/null 2>&1; then runuser -u munge -- /usr/sbin/munged
        else /usr/sbin/munged --force; fi
        STARTED+=(/run/munge/munged.pid)
        sleep 1
    fi
    munge -n </dev/null | unmunge >/dev/null || fail "munge does not work (munged: see /var/log/munge/munged.log)"
    # accounting (sacct, which submitit polls for job states): slurmdbd on a local MariaDB
    if ! mysqladmin ping >/dev/null 2>&1; then
        say "starting mariadb"
        mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
        (cd / && nohup mysqld_safe --skip-syslog >/dev/null 2>&1 &)
        STARTED_DB=1
        for _ in $(seq 60); do mysqladmin ping >/dev/null 2>&1 && break; sleep 1; done
        mysqladmin ping >/dev/null 2>&1 || fail "mariadb did not start"
    fi
    mysql -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db; CREATE USER IF NOT EXISTS 'slurm'@'localhost'
              IDENTIFIED BY 'slurmcheck'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
    cat >"$conf/slurmdbd.conf" <<END
# generated by experiments/slurm_check.sh: accounting for the single-node SLURM
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$conf/slurmdbd.pid
LogFile=$conf/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurmcheck
StorageLoc=slurm_acct_db
DbdPort=$dbd_port
END
    chmod 600 "$conf/slurmdbd.conf"
    cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # GNU nproc reports OMP_NUM_THREADS (exported: 1)
    mem=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.8}' /proc/meminfo)
    cat >"$conf/slurm.conf" <<EOF
# generated by experiments/slurm_check.sh: a single-node SLURM on localhost
ClusterName=mtadcheck
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$conf/state
SlurmdSpoolDir=$conf/spool
SlurmctldPidFile=$conf/slurmctld.pid
SlurmdPidFile=$conf/slurmd.pid
SlurmctldLogFile=$conf/log/slurmctld.log
SlurmdLogFile=$conf/log/slurmd.log
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$dbd_port
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
MinJobAge=600
KillWait=5
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=check Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
    export SLURM_CONF="$conf/slurm.conf"  # slurmdbd reads slurmdbd.conf beside it
    say "starting slurmdbd, slurmctld and slurmd ($cpus CPUs, $mem MB; ports $ctld_port, $slurmd_port, $dbd_port) with $SLURM_CONF"
    /usr/sbin/slurmdbd && STARTED+=("$conf/slurmdbd.pid")
    alive "$conf/slurmdbd.pid" slurmdbd "$conf/log/slurmdbd.log"
    for _ in $(seq 30); do timeout 5 sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 1; done
    timeout 5 sacctmgr -n list cluster >/dev/null 2>&1 || fail "slurmdbd did not start (log: $conf/log/slurmdbd.log)"
    timeout 10 sacctmgr -i -Q add cluster mtadcheck >/dev/null 2>&1 || true  # an existing one is fine
    /usr/sbin/slurmctld -i && STARTED+=("$conf/slurmctld.pid")
    alive "$conf/slurmctld.pid" slurmctld "$conf/log/slurmctld.log"
    /usr/sbin/slurmd -N localhost && STARTED+=("$conf/slurmd.pid")
    alive "$conf/slurmd.pid" slurmd "$conf/log/slurmd.log"
    for _ in $(seq 60); do
        for daemon in slurmdbd slurmctld slurmd; do
            alive "$conf/$daemon.pid" "$daemon" "$conf/log/$daemon.log" 0
        done
        if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
            ours || fail "sinfo answers for cluster '$(cluster_name)', not the local mtadcheck one"
            return 0
        fi
        sleep 1
    done
    sinfo || true
    fail "the local node did not come up (logs: $conf/log/)"
}
if sinfo -h >/dev/null 2>&1; then
    say "using the cluster sinfo answers for: '$(cluster_name)', controller $(scontrol show config 2>/dev/null |
        awk -F' *= *' '$1 == "SlurmctldHost[0]" {print $2}'), config ${SLURM_CONF:-/etc/slurm/slurm.conf}"
    say "(not a cluster this check started: unset SLURM_CONF or stop that controller to test a local one)"
elif [ -s "$DIR/cluster/slurm.conf" ] && SLURM_CONF="$DIR/cluster/slurm.conf" sinfo -h >/dev/null 2>&1 &&
     SLURM_CONF="$DIR/cluster/slurm.conf" ours; then
    export SLURM_CONF="$DIR/cluster/slurm.conf"
    say "using the local cluster already running ($SLURM_CONF)"
else
    start_local
    [ "${SLURM_CHECK_KEEP:-0}" = 1 ] || { trap stop_local EXIT; trap 'exit 130' INT TERM; }
fi
sinfo
sbatch --version

# ---- 2. the sweep --------------------------------------------------------------------------------------------
RESULTS="$DIR/results"
SWEEP="$DIR/multirun"
rm -rf "$RESULTS" "$SWEEP"
mkdir -p "$RESULTS"
"$PY" - "$DIR/prompts.jsonl" <<'EOF'
import json, sys
rows = [{"id": f"p{i}", "prompt": f"Question {i}: name a colour.", "answer": "red"} for i in range(24)]
open(sys.argv[1], "w").write("".join(json.dumps(r) + "\n" for r in rows))
EOF
JOB_NAME="mtad-slurm-check-$$"
LAUNCHER=(hydra/launcher=slurm "hydra.launcher.name=$JOB_NAME" hydra.launcher.cpus_per_task=1 hydra.launcher.mem_gb=1
          hydra.launcher.gpus_per_node=null hydra.launcher.timeout_min=20 "hydra.sweep.dir=$SWEEP")
[ -n "${SLURM_CHECK_PARTITION:-}" ] && LAUNCHER+=("hydra.launcher.partition=$SLURM_CHECK_PARTITION")
[ -n "${SLURM_CHECK_ACCOUNT:-}" ] && LAUNCHER+=("+hydra.launcher.additional_parameters.account=$SLURM_CHECK_ACCOUNT")
ARGS=(-m "${LAUNCHER[@]}" model=tiny task=jsonl "task.data_file=$DIR/prompts.jsonl" task.n_prompts=24
      "decoder=$DECODERS" decoder.max_new_tokens=48 warmup=0 num_threads=1 name=slurm_check "results_dir=$RESULTS")
rows() { if [ -f "$RESULTS/slurm_check.jsonl" ]; then wc -l <"$RESULTS/slurm_check.jsonl"; else echo 0; fi; }
say "pass 1: $N_RUNS runs ($DECODERS) as one job array; one running job will be cancelled"
"$PY" -m mtad "${ARGS[@]}" >"$DIR/pass1.out" 2>&1 &
SWEEP_PID=$!

# ---- 3. cancel one running job midway ---------------------------------------------------------------------------
CANCELLED=""
for _ in $(seq 600); do
    running=$(squeue -h -u "$(id -un)" -n "$JOB_NAME" -t RUNNING -o %i 2>/dev/null | grep _ | head -n1 || true)
    if [ -n "$running" ]; then
        sleep 2  # it is importing torch / decoding: its row is written only at the end
        if [ "$(rows)" -lt "$N_RUNS" ]; then
            say "scancel $running (running; rows so far: $(rows))"
            scancel "$running"
            CANCELLED=$running
            break
        fi
    fi
    kill -0 "$SWEEP_PID" 2>/dev/null || break
    sleep 0.5
done
[ -n "$CANCELLED" ] || { cat "$DIR/pass1.out"; fail "no running job to cancel was seen"; }
set +e
wait "$SWEEP_PID"
PASS1=$?
set -e
# the launcher stops at the first failed job, but the other array tasks are SLURM's: they run to the end
say "pass 1's launcher exited with $PASS1; waiting for the array's other jobs"
squeue -n "$JOB_NAME" || true
for _ in $(seq 1200); do
    [ -z "$(squeue -h -n "$JOB_NAME" 2>/dev/null)" ] && break
    sleep 1
done
[ -z "$(squeue -h -n "$JOB_NAME")" ] || fail "jobs of $JOB_NAME still queued after 20 minutes"
sacct -X -n --name "$JOB_NAME" -o JobID,State,Elapsed | sed 's/^/  sacct| /'
say "pass 1 exited with $PASS1 (non-zero expected: a job was cancelled); rows: $(rows)"
tail -n 5 "$DIR/pass1.out" | sed 's/^/  pass1| /'
AFTER1=$(rows)
[ "$AFTER1" -eq $((N_RUNS - 1)) ] || fail "pass 1 wrote $AFTER1 rows, expected $((N_RUNS - 1)) ($N_RUNS runs, one cancelled)"
cp "$RESULTS/slurm_check.jsonl" "$DIR/rows_after_pass1.jsonl"

# ---- 4. the same sweep again: exactly the missing row ---------------------------------------------------------------
say "pass 2: the same sweep; the $AFTER1 finished runs are skipped by config hash"
"$PY" -m mtad "${ARGS[@]}" >"$DIR/pass2.out" 2>&1 || { cat "$DIR/pass2.out"; fail "pass 2 failed"; }
tail -n 3 "$DIR/pass2.out" | sed 's/^/  pass2| /'
"$PY" experiments/slurm_check_rows.py "$DIR/rows_after_pass1.jsonl" "$RESULTS/slurm_check.jsonl" "$DECODERS" ||
    fail "the rows after pass 2 are not pass 1's plus exactly the cancelled run's"
say "OK in $(( $(date +%s) - START )) s (log: $LOG)"
