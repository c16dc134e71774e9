#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs what is missing, then builds and runs every test twice: a normal
# (Release) build and an AddressSanitizer + UndefinedBehaviorSanitizer build.
# Warnings are errors in both. The Release build is also installed into a
# temporary prefix, and tests/consumer/run.sh builds and runs programs
# against it (pkg-config, find_package, add_subdirectory).
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
echo "all tests passed in both builds; the installed library works for other programs"
