#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#   tools/test.sh            every test, in three builds (what CI runs)
#   tools/test.sh --quick    the quick tier of the Release build: a minute
#
# The full run installs what is missing, then:
# 1. in a fresh Debian root (tools/fresh_root.sh: debootstrap, then nothing
#    but tools/install_deps.sh), the Release build and every test, and the
#    library installed into a temporary prefix with programs built against
#    it (tests/consumer/run.sh: pkg-config, find_package, add_subdirectory).
#    A package the list lacks fails here even when this machine has it.
#    --no-fresh-root runs this stage on this machine instead;
# 2. an AddressSanitizer + UndefinedBehaviorSanitizer build with allocation
#    failure injection (-DZDIST_FAULT_INJECT=ON) and every test, the
#    injection driver test_fault_alloc among them;
# 3. a ThreadSanitizer build and the tests of the threaded code (below);
# 4. every libFuzzer target built (clang, ASan + UBSan) and run 15 s from
#    its seeds (tools/fuzz.sh), so that none rots between the developers'
#    hour-long runs.
# Warnings are errors in every build. Tests carry a tier label (quick,
# world, slow: tests/CMakeLists.txt); --stage release|sanitize|tsan|fuzz runs one
# stage here (the fresh root runs "--stage release").
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=""
trap '[ -z "$prefix" ] || rm -rf "$prefix"' EXIT
mode=all
fresh=1
while [ $# -gt 0 ]; do
  case $1 in
    --quick) mode=quick ;;
    --stage) mode=${2:?--stage needs release, sanitize, tsan or fuzz}; shift ;;
    --no-fresh-root) fresh=0 ;;
    *) echo "usage: $0 [--quick | --stage release|sanitize|tsan|fuzz] [--no-fresh-root]" >&2; exit 2 ;;
  esac
  shift
done
tools/install_deps.sh
jobs=$(nproc)
# OpenBLAS's thread pool is capped at two threads (unless
# OPENBLAS_NUM_THREADS is already set) so that tests running side by side,
# each forking a world of processes, do not start a thread per core in
# every process. Leak checking is on (ASan's default on Linux).
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-2}

build() {   # build DIR CMAKE_FLAGS...
  local dir=$1
  shift
  cmake -S . -B "$dir" "$@" > /dev/null
  cmake --build "$dir" -j "$jobs"
}

if [ $mode = quick ]; then
  echo "=== release build ==="
  build build-test-release -DCMAKE_BUILD_TYPE=Release -DZDIST_WERROR=ON
  echo "=== quick tier ==="
  start=$SECONDS
  (cd build-test-release && ctest -j "$jobs" -L quick --output-on-failure)
  echo "quick tier passed in $((SECONDS - start)) s"
  exit 0
fi

if [ $mode = all ] || [ $mode = release ]; then
  if [ $mode = all ] && [ $fresh = 1 ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    echo "=== release stage, in a fresh Debian root ==="
    $SUDO tools/fresh_root.sh env OPENBLAS_NUM_THREADS="$OPENBLAS_NUM_THREADS" \
      tools/test.sh --stage release
  else
    echo "=== release build ==="
    build build-test-release -DCMAKE_BUILD_TYPE=Release -DZDIST_WERROR=ON
    echo "=== release tests ==="
    (cd build-test-release && ctest -j "$jobs" --output-on-failure)
    echo "=== install and consume ==="
    prefix=$(mktemp -d)
    cmake --install build-test-release --prefix "$prefix" > /dev/null
    tests/consumer/run.sh "$prefix"
    rm -rf "$prefix"
    prefix=""
  fi
fi

if [ $mode = all ] || [ $mode = sanitize ]; then
  echo "=== sanitize build ==="
  # With allocation failure injection (tests/test_fault_alloc.c; its cost
  # is a check of a thread-local counter per allocation).
  build build-test-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZDIST_WERROR=ON -DZDIST_SANITIZE=ON \
    -DZDIST_FAULT_INJECT=ON
  echo "=== sanitize tests ==="
  (cd build-test-sanitize && ctest -j "$jobs" --output-on-failure)
fi
if [ $mode = all ] || [ $mode = tsan ]; then

# ThreadSanitizer (-DZDIST_TSAN=ON; tests/CMakeLists.txt sets its options and
# tests/tsan.supp). Its processes run 5 to 15 times slower, too slow for the
# whole suite in CI's budget, so this stage runs the tests of the code that
# has threads of its own: rpc/ (the I/O thread, the worker pool, futures,
# RRefs, shared memory, streams and tensors above each streaming threshold,
# peer loss, rejoin), dist_autograd/ and dist_optim/ (the engine and its
# callbacks across processes), ps/ (push/pull shards, whose rounds complete
# on RPC threads and in peer-loss callbacks, the remote model, the
# trainers' registry: test_ps_pushpull, 22 s under TSan on 2 cores,
# test_ps_model, test_ps_trainers), nn's thread pool (test_nn_model), forwards
# from several threads on one LSTM (test_nn_rnn), per-thread
# scopes, logging and metrics from several threads, the launcher
# (test_launch, test_launch_rejoin), intruders against a world with a key
# (CURVE), and the pipeline, ps_sync_async and rl_rpc examples
# (ps_sync_async without its 200-iteration accuracy run under TSan:
# single-threaded math the other two builds check; its 12-iteration sync
# and async worlds run).
# Left out:
# - the single-threaded math (autograd, nn ops, golden cases, optim, data
#   sets, checkpoints) and the checks that run no zdist code (check_*,
#   compile_*, docs);
# - the whole training runs of rpc_ps and rnn_rpc (test_rpc_ps,
#   test_fault_matrix, test_hosts, test_launch_nodes, test_launch_netns,
#   test_ps_resume, test_ps_rejoin, launcher_slurm, launcher_mpirun,
#   test_rnn_rpc): the examples' own 60 s RPC timeout expired under TSan
#   (ps_forward in test_launch_nodes, test_launch_netns and test_ps_resume;
#   __dist_backward in test_rnn_rpc; load average 15-35), and they take 2
#   to over 7 minutes each (test_ps_rejoin had not finished in 6.5). That
#   timeout now stretches tenfold here too (ZDIST_RPC_TIMEOUT_S,
#   tests/CMakeLists.txt), but test_rnn_rpc and test_ps_resume, run at a
#   low priority beside a loop of Release runs, had still not finished in
#   the 10 minutes ctest gives each: not yet shown to fit CI's budget;
# - test_faults: its deadlines are wall-clock bounds on rpc_ps runs (a
#   trainer at its 20th batch within 240 s, a frozen one found within 10 s
#   at a 1 s heartbeat); under TSan the trainer had not reached its 20th
#   batch in 240 s;
# - test_rpc_ps_safetensors: whole rpc_ps worlds, as test_rpc_ps;
# - test_hostile_rendezvous: its floods of half-open connections overflow
#   TSan's history, so the stack of libzmq's write of a received frame is
#   lost and tsan.supp's libzmq lines no longer match the report of our
#   read of it (the handoff through libzmq's pipe, seen on rpc/net/shm.c's
#   announcement of a segment): noise of the kind tsan.supp hides;
# - test_hostile_rpc, which floods a process with hundreds of MiB and bounds
#   its RSS: under TSan the stream bomb left rank 0 at 803 MiB for a bound
#   of +224 MiB (TSan's shadow memory and allocator change what RSS
#   measures).
tsan_tests='^(test_rpc_.*|test_dist_.*|test_peer_lost|test_hostile_auth|test_hostile_dist|test_hostile_shm|test_nn_model|test_nn_rnn|test_scope|test_log|test_metrics|test_launch|test_launch_rejoin|test_rejoin|test_pipeline|test_ps_sync_async|test_ps_pushpull|test_ps_model|test_ps_trainers|test_rl_rpc)$'
tsan_skip='^(test_rpc_ps|test_rpc_ps_safetensors)$'
dir=build-test-tsan
echo "=== tsan build ==="
build "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZDIST_WERROR=ON -DZDIST_TSAN=ON
echo "=== tsan tests ==="
(cd "$dir" && ctest -j "$jobs" --output-on-failure -R "$tsan_tests" -E "$tsan_skip")
# A report fails the process it happens in (exit status 66); this catches
# the ones in processes whose status no test looks at (a rank killed on
# purpose, a program expected to fail).
if grep -q "WARNING: ThreadSanitizer" "$dir/Testing/Temporary/LastTest.log"; then
  grep -B2 -A40 "WARNING: ThreadSanitizer" "$dir/Testing/Temporary/LastTest.log"
  echo "ThreadSanitizer reported a race (above)"
  exit 1
fi
fi

if [ $mode = all ] || [ $mode = fuzz ]; then
  echo "=== fuzz targets, 15 s each ==="
  mkdir -p build-test-fuzz
  for target in fuzz_codec fuzz_stream fuzz_rendezvous fuzz_dist fuzz_safetensors; do
    # libFuzzer's progress lines go to a log, shown whole only on failure
    log=build-test-fuzz/$target.log
    if ! FUZZ_BUILD_DIR=build-test-fuzz tools/fuzz.sh 15 "$target" > "$log" 2>&1; then
      cat "$log"
      echo "fuzz stage: $target failed (its log above; the input is in build-test-fuzz/artifacts/)"
      exit 1
    fi
    echo "$target: $(grep -E '^Done [0-9]+ runs' "$log" | tail -1)"
  done
fi
[ $mode = all ] &&
  echo "all tests passed in the three builds, the installed library works for other programs, and every fuzz target ran"
exit 0
