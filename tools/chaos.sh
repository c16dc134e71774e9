#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# chaos: an rpc_ps world of 2 server shards and 6 trainers under
# `launch --max_restarts` with --checkpoint, where every 5-20 s a random
# process of the world (trainer or shard) is killed (SIGKILL) or frozen
# (SIGSTOP, then SIGCONT 1-40 s later), for MINUTES minutes. Then the same
# world runs again untouched, with the same seed and batches, and the
# script prints (issue 25, item 5):
#   - whether every process ended on its own: launch exited by itself, 0,
#     within a bound after the training (nothing killed by this script);
#   - the trainers' final test accuracy against the untouched run's;
#   - the server shards' resident memory (VmRSS, both shards summed) at
#     the end of the training against after its first minute;
#   - the RRefs and distributed autograd contexts reported leaked: what
#     each process's final metrics line (ZDIST_METRICS) still counts
#     (num_owner_rrefs, num_autograd_contexts, written after the graceful
#     shutdown's last barrier), the shutdown warning "owned RRef value(s)
#     still referenced" and contexts the library released as orphans
#     ("unused for N s: released").
#
#   tools/chaos.sh MINUTES [--seed=N] [--csv] [--build=DIR] [more: --help]
#
# It is not part of the test suite (it runs for about twice MINUTES). The
# chaos schedule comes from the seed (printed; --seed repeats it); what it
# hits depends on timing too. The logs stay in the folder it names. Exit
# status: 0 when every goal is met, 1 when one is missed, 2 for bad usage.

# One block, read whole before it runs: an edit of this file during a run
# (which lasts an hour) does not change what the run does.
{
set -uo pipefail

usage() {
  cat <<'EOF'
usage: tools/chaos.sh MINUTES [flags]
Runs rpc_ps (2 server shards, 6 trainers) under launch --max_restarts with
--checkpoint for about MINUTES minutes while killing (SIGKILL) or freezing
(SIGSTOP for 1-40 s) one random process every 5-20 s; then the same world
without chaos; prints the figures (a table, or name,value,unit lines).
flags:
  --seed=N             chaos schedule seed (default: random; printed)
  --csv                print name,value,unit lines instead of the table
  --build=DIR          build folder with examples/rpc_ps and tools/launch
                       (default: $ZDIST_BUILD_DIR, else build/)
  --max_batches=N      batches per trainer (default: sized so that the chaos
                       run trains for about MINUTES on a 2-core machine)
  --rate=R             batches per second per trainer under chaos, for that
                       sizing (default: 5, measured here)
  --ps_seed=N          rpc_ps --seed, the same in both runs (default: 1)
  --checkpoint_every=N rpc_ps --checkpoint_every (default: 100)
  --max_restarts=N     launch --max_restarts (default: 1000)
  --heartbeat_s=S      ZDIST_HEARTBEAT_S: a frozen process is declared lost
                       after S s (default: the library's 30 s)
  --no_unbroken        skip the untouched run (no accuracy comparison)
  --schedule=FILE      the events of FILE instead of the seed's: lines "MS RANK
                       kill 0" or "MS RANK stop STOP_MS", MS after launch
                       started (each run writes its own as schedule.txt)
EOF
}

here=$(cd "$(dirname "$0")/.." && pwd)
build=${ZDIST_BUILD_DIR:-$here/build}
minutes="" seed="" csv=0 max_batches="" rate=5 ps_seed=1 ck_every=100
max_restarts=1000 heartbeat_s="" unbroken=1 schedule=""
for a in "$@"; do
  case $a in
    --seed=*) seed=${a#*=} ;;
    --csv) csv=1 ;;
    --build=*) build=${a#*=} ;;
    --max_batches=*) max_batches=${a#*=} ;;
    --rate=*) rate=${a#*=} ;;
    --ps_seed=*) ps_seed=${a#*=} ;;
    --checkpoint_every=*) ck_every=${a#*=} ;;
    --max_restarts=*) max_restarts=${a#*=} ;;
    --heartbeat_s=*) heartbeat_s=${a#*=} ;;
    --no_unbroken) unbroken=0 ;;
    --schedule=*) schedule=${a#*=} ;;
    --help | -h) usage; exit 0 ;;
    -*) echo "chaos: unknown flag $a (--help lists them)" >&2; exit 2 ;;
    *) [ -z "$minutes" ] || { echo "chaos: one MINUTES only" >&2; exit 2; }; minutes=$a ;;
  esac
done
isnum() { [[ $1 =~ ^[0-9]+([.][0-9]+)?$ ]]; }
isint() { [[ $1 =~ ^[0-9]+$ ]]; }
if [ -z "$minutes" ] || ! isnum "$minutes" || ! awk "BEGIN{exit !($minutes > 0)}"; then
  usage >&2; exit 2
fi
[ -n "$seed" ] || seed=$(( $(od -An -N2 -tu2 /dev/urandom) ))
for v in "$seed" "$ps_seed" "$ck_every" "$max_restarts" ${max_batches:+"$max_batches"} \
         ${heartbeat_s:+"$heartbeat_s"}; do
  isint "$v" || { echo "chaos: \"$v\" is not a whole number" >&2; exit 2; }
done
isnum "$rate" || { echo "chaos: --rate=$rate is not a number" >&2; exit 2; }
ps=$build/examples/rpc_ps launch=$build/tools/launch
for f in "$ps" "$launch"; do
  [ -x "$f" ] || { echo "chaos: $f is missing (build it, or give --build=DIR)" >&2; exit 2; }
done

NPROC=8 SERVERS=2 TRAINERS=6
BATCHES_PER_EPOCH=1875           # 60,000 training images in batches of 32
GAP_MIN=50 GAP_MAX=200           # tenths of a second between two events
STOP_MIN=10 STOP_MAX=400         # tenths of a second a frozen process stays frozen
SAMPLE_MS=2000                   # servers' VmRSS every 2 s
END_BOUND_S=240                  # the world's end after the last trainer's accuracy:
                                 # --server_wait_s (120) for a lost trainer, then shutdown
chaos_s=$(awk "BEGIN{printf \"%d\", $minutes * 60 + 0.5}")
[ -n "$max_batches" ] || max_batches=$(awk "BEGIN{printf \"%d\", $rate * $minutes * 60 + 0.5}")
[ "$max_batches" -ge 1 ] || max_batches=1
epochs=$(( (max_batches + BATCHES_PER_EPOCH - 1) / BATCHES_PER_EPOCH ))
# Every wait is bounded: a world may take this long in all (training
# slowed down by the chaos included) before it is stopped and counted as
# not ending on its own.
limit_s=$(( 2 * chaos_s + 600 ))

T=$(mktemp -d "${TMPDIR:-/tmp}/zdist-chaos-XXXXXX") || exit 1
say() { printf '%s\n' "$*" >&2; }
say "chaos: seed $seed (tools/chaos.sh $minutes --seed=$seed repeats the schedule); logs in $T"
say "chaos: $TRAINERS trainers x $max_batches batches ($epochs epoch(s)), checkpoint every $ck_every"

# ---- process bookkeeping ----

launch_pid=""     # the running launch
stopped=()        # "pid due_ms" of processes this script froze
now=0
tick() { local t=${EPOCHREALTIME/[.,]/}; now=$(( t / 1000 )); }

# Every process of the world this script runs has the run's folder in its
# command line; the bracket keeps grep's own command line from matching.
our_pids() {
  local pat
  pat=$(printf '%s' "$T/" | sed 's/[][\.*^$]/\\&/g')
  grep -lsaE -- "${pat%?}[/]" /proc/[0-9]*/cmdline 2> /dev/null |
    sed -n 's|^/proc/\([0-9]*\)/cmdline$|\1|p' | grep -vx "$$"
}

thaw_all() {
  local e
  for e in "${stopped[@]}"; do kill -CONT "${e% *}" 2> /dev/null; done
  stopped=()
}

cleanup() {
  local p i
  thaw_all
  if [ -n "$launch_pid" ] && kill -0 "$launch_pid" 2> /dev/null; then
    kill -TERM "$launch_pid" 2> /dev/null   # launch stops its world (5 s grace)
    for ((i = 0; i < 150; i++)); do
      kill -0 "$launch_pid" 2> /dev/null || break
      sleep 0.1
    done
    kill -KILL "$launch_pid" 2> /dev/null
  fi
  for p in $(our_pids); do kill -CONT "$p" 2> /dev/null; kill -KILL "$p" 2> /dev/null; done
}
trap cleanup EXIT
trap 'say "chaos: interrupted; logs in $T"; exit 130' INT
trap 'say "chaos: terminated; logs in $T"; exit 143' TERM

# rank_pid R: the live process of rank R (a child of launch), or nothing.
rank_pid() {
  local c p
  for c in /proc/"$launch_pid"/task/*/children; do
    # shellcheck disable=SC2013  # (one line of pids)
    for p in $(cat "$c" 2> /dev/null); do
      if tr '\0' '\n' 2> /dev/null < "/proc/$p/cmdline" | grep -qx -- "--rank=$1"; then
        [ "$(awk '{print $3}' "/proc/$p/stat" 2> /dev/null)" != Z ] && echo "$p" && return 0
      fi
    done
  done
  return 1
}

rss_kb() { awk '/^VmRSS:/{print $2}' "/proc/$1/status" 2> /dev/null; }

# ---- the chaos schedule, drawn from the seed before anything runs ----

RANDOM=$seed
sched=()    # "at_ms rank kill|stop stop_ms"
t_ms=0
while [ -z "$schedule" ]; do
  t_ms=$(( t_ms + (GAP_MIN + RANDOM % (GAP_MAX - GAP_MIN + 1)) * 100 ))
  [ "$t_ms" -lt $(( chaos_s * 1000 )) ] || break
  r=$(( RANDOM % NPROC ))
  if (( RANDOM % 2 )); then
    sched+=("$t_ms $r stop $(( (STOP_MIN + RANDOM % (STOP_MAX - STOP_MIN + 1)) * 100 ))")
  else
    sched+=("$t_ms $r kill 0")
  fi
done
if [ -n "$schedule" ]; then
  while read -r t_ms r what ms; do
    [[ $t_ms =~ ^[0-9]+$ && $r =~ ^[0-9]+$ && $r -lt $NPROC && $what =~ ^(kill|stop)$ &&
       $ms =~ ^[0-9]+$ ]] || { say "chaos: $schedule: bad line \"$t_ms $r $what $ms\""; exit 2; }
    sched+=("$t_ms $r $what $ms")
  done < "$schedule" || exit 2
  say "chaos: the schedule of $schedule (${#sched[@]} events)"
fi
printf '%s\n' "${sched[@]}" > "$T/schedule.txt"

# ---- one world ----

# run_world NAME CHAOS: runs the world in $T/NAME (chaos 1: with the
# schedule) and sets its figures in w_* variables.
run_world() {
  local name=$1 chaos=$2 dir=$T/$1
  mkdir -p "$dir"
  local -a env=(ZDIST_METRICS="$dir/metrics" ZDIST_MASTER_WAIT_S=120)
  [ -n "$heartbeat_s" ] && env+=(ZDIST_HEARTBEAT_S="$heartbeat_s")
  env "${env[@]}" "$launch" --nproc=$NPROC --max_restarts="$max_restarts" --log_dir="$dir/logs" \
    -- "$ps" --num_servers=$SERVERS --max_batches="$max_batches" --epochs="$epochs" \
    --seed="$ps_seed" --checkpoint="$dir/ck" --checkpoint_every="$ck_every" --progress_s=30 \
    > "$dir/launch.out" 2> "$dir/launch.err" &
  launch_pid=$!
  tick
  local t0=$now next=0 n_sched=${#sched[@]} chaos_end="" train_end="" acc_end="" ended=0
  local last_sample=0 first_rss="" end_rss="" killed_by_us=0 status="" e at r what ms p i
  w_kills=0 w_stops=0 w_skipped=0
  : > "$dir/events.txt"
  : > "$dir/rss.txt"
  [ "$chaos" = 1 ] || chaos_end=$t0
  while :; do
    tick
    local el=$(( now - t0 ))
    if ! kill -0 "$launch_pid" 2> /dev/null; then ended=1; break; fi
    # Wake the processes whose freeze is over.
    local keep=()
    for e in "${stopped[@]}"; do
      if [ "${e#* }" -le "$now" ]; then kill -CONT "${e% *}" 2> /dev/null
      else keep+=("$e"); fi
    done
    stopped=("${keep[@]}")
    # The training is over once a trainer has done its batches: no more
    # chaos then (a process restarted into a world that is shutting down
    # has nothing to join).
    if [ -z "$train_end" ] && grep -qs "^Training complete!" "$dir"/logs/rank_0[2-7].log; then
      train_end=$el
    fi
    if [ -z "$chaos_end" ] && { [ -n "$train_end" ] ||
                                { [ "$next" -ge "$n_sched" ] && [ ${#stopped[@]} = 0 ]; }; }; then
      chaos_end=$el
      thaw_all
      say "chaos: $name run: chaos over after $(( el / 1000 )) s ($w_kills kills, $w_stops freezes)"
    fi
    while [ -z "$chaos_end" ] && [ "$next" -lt "$n_sched" ]; do
      read -r at r what ms <<< "${sched[next]}"
      [ "$at" -le "$el" ] || break
      next=$(( next + 1 ))
      if ! p=$(rank_pid "$r"); then
        w_skipped=$(( w_skipped + 1 ))
        echo "$(( el / 1000 )) s: rank $r has no process now (restarting): skipped" >> "$dir/events.txt"
        continue
      fi
      if [ "$what" = kill ]; then
        kill -KILL "$p" 2> /dev/null && w_kills=$(( w_kills + 1 ))
        echo "$(( el / 1000 )) s: SIGKILL rank $r (pid $p)" >> "$dir/events.txt"
      else
        kill -STOP "$p" 2> /dev/null && w_stops=$(( w_stops + 1 ))
        # A process frozen again while frozen stays so until the later end.
        local due=$(( now + ms )) keep=()
        for e in "${stopped[@]}"; do
          if [ "${e% *}" = "$p" ]; then [ "${e#* }" -gt "$due" ] && due=${e#* }
          else keep+=("$e"); fi
        done
        stopped=("${keep[@]}" "$p $due")
        echo "$(( el / 1000 )) s: SIGSTOP rank $r (pid $p) for $(( ms / 1000 )).$(( ms % 1000 / 100 )) s" \
          >> "$dir/events.txt"
      fi
    done
    # The servers' resident memory, while they train.
    if [ -z "$train_end" ] && [ $(( now - last_sample )) -ge $SAMPLE_MS ]; then
      last_sample=$now
      local sum=0 both=1 line="$(( el / 1000 ))"
      for ((i = 0; i < SERVERS; i++)); do
        local kb=""
        p=$(rank_pid "$i") && kb=$(rss_kb "$p")
        if [ -n "$kb" ]; then sum=$(( sum + kb )); line="$line $p $kb"; else both=0; line="$line - -"; fi
      done
      echo "$line" >> "$dir/rss.txt"
      if [ "$both" = 1 ]; then
        [ -z "$first_rss" ] && [ "$el" -ge 60000 ] && first_rss=$sum
        end_rss=$sum
      fi
    fi
    # Bounds: the whole run, and the end after the trainers' accuracies.
    if [ -z "$acc_end" ] && [ "$(grep -ls "^Rank [0-9]* test accuracy" "$dir"/logs/rank_0[2-7].log |
                                  wc -l)" -ge $TRAINERS ]; then
      acc_end=$el
    fi
    if [ "$el" -ge $(( limit_s * 1000 )) ] ||
       { [ -n "$acc_end" ] && [ $(( el - acc_end )) -ge $(( END_BOUND_S * 1000 )) ]; }; then
      say "chaos: $name run: the world did not end on its own (after $(( el / 1000 )) s): stopping it"
      killed_by_us=1
      cleanup
      break
    fi
    sleep 0.2
  done
  wait "$launch_pid" 2> /dev/null
  status=$?
  launch_pid=""
  thaw_all
  tick
  w_secs=$(( (now - t0) / 1000 ))
  w_chaos_s=$(( ${chaos_end:-0} / 1000 ))
  w_train_s=$(( ${train_end:-$(( now - t0 ))} / 1000 ))
  w_status=$status
  w_own=$(( ended && !killed_by_us ))
  w_rss_first=$(( ${first_rss:-0} / 1024 )) w_rss_end=$(( ${end_rss:-0} / 1024 ))
  [ -n "$first_rss" ] || w_rss_first=""
  w_restarts=$(grep -c "restarting it" "$dir/launch.err")
  # Each trainer's last accuracy line (a restarted trainer's log holds its
  # earlier lives first).
  local accs=() f
  for ((r = SERVERS; r < NPROC; r++)); do
    f=$(printf '%s/logs/rank_%02d.log' "$dir" "$r")
    a=$(grep -s "^Rank $r test accuracy" "$f" | tail -1 | awk '{print $5}')
    [ -n "$a" ] && accs+=("$a")
  done
  w_trainers_done=${#accs[@]}
  w_acc=$(printf '%s\n' "${accs[@]}" | awk 'NF{s+=$1; n++} END{if (n) printf "%.2f", s/n}')
  # Leaks. The last life of each rank: its final metrics line (none when
  # it did not shut down gracefully) and its shutdown warning; every life:
  # contexts released as orphans.
  w_rrefs=0 w_ctx=0 w_nofinal=0
  for f in "$dir"/metrics/*.jsonl; do
    [ -e "$f" ] || continue
    local last
    last=$(tail -n 1 "$f")
    if [[ $last != *'"final":true'* ]]; then w_nofinal=$(( w_nofinal + 1 )); continue; fi
    w_rrefs=$(( w_rrefs + $(grep -o '"num_owner_rrefs":[0-9]*' <<< "$last" | cut -d: -f2 | head -1) + 0 ))
    w_ctx=$(( w_ctx + $(grep -o '"num_autograd_contexts":[0-9]*' <<< "$last" | cut -d: -f2 | head -1) + 0 ))
  done
  local nfiles
  nfiles=$(find "$dir/metrics" -name '*.jsonl' 2> /dev/null | wc -l)
  w_nofinal=$(( w_nofinal + NPROC - nfiles ))
  # The shutdown warning of each rank's last life (after launch's last
  # "restarted" line), and of the lives before (a process whose shutdown
  # failed because the chaos took a peer it needed).
  w_rref_warn=0 w_rref_warn_before=0
  for ((r = 0; r < NPROC; r++)); do
    f=$(printf '%s/logs/rank_%02d.log' "$dir" "$r")
    read -r n b < <(awk '/^launch: rank [0-9]+ restarted/{b += n; n = 0}
                         /shutdown: [0-9]+ owned RRef value\(s\) still referenced/{
                           for (i = 1; i <= NF; i++) if ($i == "shutdown:") n += $(i + 1)}
                         END{print n + 0, b + 0}' "$f" 2> /dev/null)
    w_rref_warn=$(( w_rref_warn + ${n:-0} )) w_rref_warn_before=$(( w_rref_warn_before + ${b:-0} ))
  done
  # The shard processes of the end figure: how long each had been running
  # then (a restarted shard starts small again), and how often each was
  # restarted.
  w_shard_ages=$(awk -v n=$SERVERS '{for (i = 0; i < n; i++) {p = $(2 + 2 * i); if (!(p in first)) first[p] = $1}
                                     if ($2 != "-" && $4 != "-") {last = $0; t = $1}}
                                     END{split(last, f, " "); s = "";
                                         for (i = 0; i < n; i++) s = s (i ? " and " : "") (t - first[f[2 + 2 * i]]) " s";
                                         print s}' "$dir/rss.txt")
  w_shard_restarts=""
  for ((r = 0; r < SERVERS; r++)); do
    w_shard_restarts="$w_shard_restarts${w_shard_restarts:+ and }$(grep -c "^launch: rank $r (pid .*restarting it" "$dir/launch.err")"
  done
  w_ctx_swept=$(cat "$dir"/logs/rank_*.log 2> /dev/null | grep -c "dist_autograd: context .* unused for .* released")
}

# ---- the runs ----

say "chaos: the chaos run ($minutes min of chaos)"
run_world chaos 1
c_secs=$w_secs c_chaos_s=$w_chaos_s c_train_s=$w_train_s c_status=$w_status c_own=$w_own
c_kills=$w_kills c_stops=$w_stops c_skipped=$w_skipped c_restarts=$w_restarts
c_rss_first=$w_rss_first c_rss_end=$w_rss_end c_done=$w_trainers_done c_acc=$w_acc
c_rrefs=$(( w_rrefs > w_rref_warn ? w_rrefs : w_rref_warn )) c_ctx=$(( w_ctx + w_ctx_swept ))
c_rrefs_final=$w_rrefs c_rref_warn=$w_rref_warn c_ctx_final=$w_ctx c_ctx_swept=$w_ctx_swept
c_nofinal=$w_nofinal c_rref_warn_before=$w_rref_warn_before c_shard_ages=$w_shard_ages
c_shard_restarts=$w_shard_restarts
u_acc="" u_secs="" u_status="" u_rss_first="" u_rss_end="" u_done=""
if [ "$unbroken" = 1 ]; then
  say "chaos: the unbroken run (same seed, same batches)"
  run_world unbroken 0
  u_acc=$w_acc u_secs=$w_secs u_status=$w_status u_done=$w_trainers_done
  u_rss_first=$w_rss_first u_rss_end=$w_rss_end
fi

# ---- figures and goals ----

gap="" growth=""
[ -n "$c_acc" ] && [ -n "$u_acc" ] && gap=$(awk "BEGIN{printf \"%.2f\", $c_acc - $u_acc}")
[ -n "$c_rss_first" ] && [ "$c_rss_first" -gt 0 ] &&
  growth=$(awk "BEGIN{printf \"%.1f\", 100 * ($c_rss_end - $c_rss_first) / $c_rss_first}")
chaos_min=$(awk "BEGIN{printf \"%.1f\", $c_chaos_s / 60}")
missed=()
[ "$c_own" = 1 ] || missed+=("not every process ended on its own: the script stopped the world")
[ "$c_own" = 1 ] && [ "$c_status" != 0 ] &&
  missed+=("launch exited $c_status, not 0 (a rank failed with its restarts used? see $T/chaos/launch.err)")
[ "$c_done" = $TRAINERS ] || missed+=("$c_done of $TRAINERS trainers printed a final accuracy")
if [ -n "$gap" ]; then
  awk "BEGIN{exit !($gap <= 3 && $gap >= -3)}" ||
    missed+=("accuracy $c_acc % against $u_acc % unbroken: $gap points, more than 3")
elif [ "$unbroken" = 1 ]; then
  missed+=("no accuracy to compare (chaos: ${c_acc:-none}, unbroken: ${u_acc:-none})")
fi
if [ -n "$growth" ]; then
  awk "BEGIN{exit !($growth <= 10)}" ||
    missed+=("server memory grew by $growth % (from $c_rss_first to $c_rss_end MB), more than 10 %")
else
  missed+=("no server memory figure (the training ended within its first minute?)")
fi
[ "$unbroken" = 1 ] && [ "$u_status" != 0 ] &&
  missed+=("the unbroken run's launch exited $u_status (see $T/unbroken/launch.err)")
[ "$c_rrefs" = 0 ] || missed+=("$c_rrefs RRef(s) reported leaked")
[ "$c_ctx" = 0 ] || missed+=("$c_ctx distributed autograd context(s) reported leaked")
[ "$c_nofinal" = 0 ] ||
  missed+=("$c_nofinal process(es) wrote no final metrics line (no graceful shutdown)")

if [ "$csv" = 1 ]; then
  echo "chaos_minutes,$chaos_min,min"
  echo "chaos_kills,$c_kills,count"
  echo "chaos_stops,$c_stops,count"
  echo "chaos_processes_ended_on_their_own,$c_own,bool"
  echo "chaos_accuracy_pct,$c_acc,%"
  echo "unbroken_accuracy_pct,$u_acc,%"
  echo "chaos_accuracy_gap_points,$gap,points"
  echo "server_rss_mb_first_minute,$c_rss_first,MB"
  echo "server_rss_mb_end,$c_rss_end,MB"
  echo "server_rss_growth_pct,$growth,%"
  echo "chaos_leaked_rrefs,$c_rrefs,count"
  echo "chaos_leaked_contexts,$c_ctx,count"
else
  row() { printf '%-38s %12s  %s\n' "$1" "$2" "$3"; }
  row "chaos_minutes" "$chaos_min" "min of chaos (the chaos run took $c_secs s in all, training $c_train_s s)"
  row "chaos_kills" "$c_kills" "SIGKILLs ($c_skipped events skipped: rank between two lives)"
  row "chaos_stops" "$c_stops" "SIGSTOPs of 1-40 s"
  row "" "" "launch restarted $c_restarts processes; exit status $c_status"
  row "chaos_processes_ended_on_their_own" "$c_own" "1: launch exited by itself; goal 1"
  row "chaos_accuracy_pct" "${c_acc:--}" "mean of $c_done trainers' final test accuracy"
  row "unbroken_accuracy_pct" "${u_acc:--}" "the same without chaos (${u_done:-0} trainers, ${u_secs:--} s, launch exit ${u_status:--})"
  row "chaos_accuracy_gap_points" "${gap:--}" "goal within 3"
  row "server_rss_mb_first_minute" "${c_rss_first:--}" "MB, both shards, 60 s after start"
  row "server_rss_mb_end" "${c_rss_end:--}" "MB, at the end of the training (shards $c_shard_ages old; restarted $c_shard_restarts times)"
  row "server_rss_growth_pct" "${growth:--}" "% (goal at most 10; unbroken run: ${u_rss_first:--} -> ${u_rss_end:--} MB)"
  row "chaos_leaked_rrefs" "$c_rrefs" "final metrics lines: $c_rrefs_final; shutdown warnings: $c_rref_warn (in lives the chaos ended: $c_rref_warn_before)"
  row "chaos_leaked_contexts" "$c_ctx" "final metrics lines: $c_ctx_final; released as orphans: $c_ctx_swept"
fi
say "chaos: seed $seed; logs in $T"
if [ ${#missed[@]} -gt 0 ]; then
  for m in "${missed[@]}"; do say "chaos: GOAL MISSED: $m"; done
  exit 1
fi
say "chaos: every goal met"
exit 0
}
