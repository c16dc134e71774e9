#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# rpc_ps under Slurm, with nothing but Slurm's variables to go on: brings up
# a one-node cluster of its own (munged, slurmctld, slurmd, all in a
# temporary folder, on free ports, killed on exit), then runs
#     srun -n 4 rpc_ps --max_batches=50
# the same from an sbatch script, and with srun --mpi=pmix (when Slurm has
# the plugin), and checks that each exits 0 with four ranks that took their
# rank from SLURM_PROCID (PMIX_RANK), their master from the node list and
# their port from SLURM_JOB_ID, and the trainers' accuracy lines.
#   usage: tests/slurm.sh BUILD_DIR     (ctest passes it)
# Exits 77 (skipped) when not root (slurmd runs jobs as their user) or
# when slurm-wlm or munge are missing (tools/install_deps.sh installs them).
#
# Ports. slurmctld's and slurmd's are free ones the kernel hands out. The
# rendezvous port is the one zd_rpc_env_resolve derives, 10000 + SLURM_JOB_ID
# % 20000: that is what this test checks. Job ids start at FirstJobId, which
# free_port --job-id draws so that the two jobs' ports are free now; they lie
# below the kernel's ephemeral range, so no other test's port can be there,
# only another run of this test, which draws its own.
set -euo pipefail
build=${1:?usage: tests/slurm.sh BUILD_DIR}
build=$(cd "$build" && pwd)
PATH=$PATH:/usr/sbin:/sbin
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root: slurmd starts jobs as their user"
for cmd in munged mungekey slurmctld slurmd srun sbatch sinfo squeue scontrol; do
  command -v "$cmd" > /dev/null ||
    skip "$cmd is missing (Debian packages slurm-wlm and munge; tools/install_deps.sh)"
done
rpc_ps=$build/examples/rpc_ps
free_port=$build/tests/support/free_port
[ -x "$rpc_ps" ] && [ -x "$free_port" ] || { echo "build rpc_ps and free_port first"; exit 1; }

dir=$(mktemp -d /tmp/zdist-slurm.XXXXXX)
chmod 755 "$dir"
pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
  for p in "${pids[@]}"; do
    # daemons get 10 s to go, then SIGKILL
    for _ in $(seq 100); do kill -0 "$p" 2> /dev/null || break; sleep 0.1; done
    kill -9 "$p" 2> /dev/null || true
  done
  if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then
    for f in "$dir"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; }; done
  fi
  rm -rf "$dir"
}
trap cleanup EXIT

# Waits until "$@" succeeds, up to $deadline_s seconds; 1 if it never does.
wait_for() {
  local what=$1 limit=$2 end
  shift 2
  end=$((SECONDS + limit))
  until "$@" > /dev/null 2>&1; do
    [ $SECONDS -lt $end ] || { echo "FAIL: $what not within ${limit} s"; return 1; }
    sleep 0.2
  done
}

# ---- munge, with its own key, socket and state ----
mkdir -m 711 "$dir/munge"
mungekey --create --keyfile="$dir/munge/munge.key" > /dev/null
socket=$dir/munge/munge.socket
munged --foreground --force --socket="$socket" --key-file="$dir/munge/munge.key" \
       --pid-file="$dir/munge/munged.pid" --seed-file="$dir/munge/munged.seed" \
       --log-file="$dir/munged.log" > "$dir/munged.out.log" 2>&1 &
pids+=($!)
wait_for "munged's socket" 30 test -S "$socket"

# ---- slurmctld and slurmd ----
host=$(hostname -s)
ports=($("$free_port" 2 $$))
ctld_port=${ports[0]} slurmd_port=${ports[1]}
first_job=$("$free_port" --job-id)
mkdir -p "$dir/state" "$dir/spool"
export SLURM_CONF=$dir/slurm.conf
cat > "$SLURM_CONF" << EOF
ClusterName=zdtest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
FirstJobId=$first_job
MailProg=/bin/true
NodeName=$host NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=zd Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
slurmctld -D -i -f "$SLURM_CONF" > "$dir/slurmctld.out.log" 2>&1 &
pids+=($!)
slurmd -D -N "$host" -f "$SLURM_CONF" > "$dir/slurmd.out.log" 2>&1 &
pids+=($!)
node_idle() { [ "$(sinfo -h -n "$host" -o %t)" = idle ]; }
wait_for "node $host idle" 60 node_idle

# ---- the checks on one run's output ($1: file, $2: job id, $3: the
# variable the rank came from, $4: the launcher) ----
check_run() {
  local out=$1 job=$2 from=$3 launcher=$4 port=$((10000 + $2 % 20000)) n
  n=$(grep -c "joining a world of 4" "$out" || true)
  [ "$n" -eq 4 ] || { echo "FAIL: $n of 4 ranks started"; return 1; }
  for r in 0 1 2 3; do
    grep -q "rpc: rank $r of 4 from $from, world size from SLURM_NTASKS, local rank $r from SLURM_LOCALID, master $host:$port from SLURM_STEP_NODELIST/SLURM_JOB_ID \[$launcher\]" "$out" ||
      { echo "FAIL: no start line of rank $r from $from with master $host:$port"; return 1; }
  done
  n=$(grep -cE "^Rank [123] test accuracy [0-9.]+ %" "$out" || true)
  [ "$n" -eq 3 ] || { echo "FAIL: $n of 3 trainers' accuracy lines"; return 1; }
  grep -m1 "rpc: rank 0 of 4" "$out" | sed 's/^.*rpc: /  /'
}
args=(--max_batches=50 --eval_samples=1000)
export ZDIST_LOG_LEVEL=info OPENBLAS_NUM_THREADS=1
# A world key, shared like munge's: the master is this host's name, which
# may resolve to an address that is not loopback (a container's).
"$build/tools/keygen" "$dir/world.key" > /dev/null
export ZDIST_KEY_FILE=$dir/world.key
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT ZDIST_MASTER_PORT

# ---- srun ----
start=$SECONDS
rc=0
timeout 600 srun -n 4 --time=10 "$rpc_ps" "${args[@]}" > "$dir/srun.out.log" 2>&1 || rc=$?
[ $rc -eq 0 ] || { echo "FAIL: srun exited with $rc"; cat "$dir/srun.out.log"; exit 1; }
check_run "$dir/srun.out.log" "$first_job" SLURM_PROCID slurm || { cat "$dir/srun.out.log"; exit 1; }
echo "srun -n 4 rpc_ps: ok in $((SECONDS - start)) s (job $first_job)"

# ---- sbatch ----
start=$SECONDS
cat > "$dir/job.sh" << EOF
#!/bin/bash
#SBATCH -n 4
#SBATCH --time=10
srun "$rpc_ps" ${args[*]}
EOF
job=$(sbatch --parsable --chdir="$dir" --output="$dir/sbatch.out.log" "$dir/job.sh")
job=${job%%;*}
job_done() { [ -z "$(squeue -h -j "$job" -o %T 2> /dev/null)" ]; }
wait_for "job $job" 600 job_done
state=$(scontrol show job "$job" 2> /dev/null | grep -o 'JobState=[A-Z]*' || true)
[ "$state" = JobState=COMPLETED ] ||
  { echo "FAIL: job $job: ${state:-gone}"; cat "$dir/sbatch.out.log"; exit 1; }
check_run "$dir/sbatch.out.log" "$job" SLURM_PROCID slurm || { cat "$dir/sbatch.out.log"; exit 1; }
echo "sbatch (srun -n 4 rpc_ps): ok in $((SECONDS - start)) s (job $job)"

# ---- srun --mpi=pmix: PMIX_RANK, and Slurm's variables for the rest ----
if srun --mpi=list 2>&1 | grep -qw pmix; then
  start=$SECONDS
  rc=0
  timeout 600 srun -n 4 --mpi=pmix --time=10 "$rpc_ps" "${args[@]}" > "$dir/pmix.out.log" 2>&1 ||
    rc=$?
  [ $rc -eq 0 ] ||
    { echo "FAIL: srun --mpi=pmix exited with $rc"; cat "$dir/pmix.out.log"; exit 1; }
  check_run "$dir/pmix.out.log" $((first_job + 2)) PMIX_RANK pmix ||
    { cat "$dir/pmix.out.log"; exit 1; }
  echo "srun -n 4 --mpi=pmix rpc_ps: ok in $((SECONDS - start)) s (job $((first_job + 2)))"
else
  echo "srun --mpi=pmix: not run (Slurm has no pmix plugin here)"
fi
