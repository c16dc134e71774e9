#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Regenerates tests/abi/libzdist.abi, the ABI that tests/check_abi.sh holds
# libzdist.so to, from a RelWithDebInfo build of the library alone (in
# build-abi, or the directory given). Run it only in the commit that bumps
# the SONAME (ZD_VERSION_MAJOR in include/zdist/version.h; before 1.0.0 is
# released, also in those that settle its API): between two bumps the
# baseline stays that of the major release's .0 (docs/conventions.md,
# "Stability").
#   usage: tools/abi_baseline.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-abi}
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZDIST_WERROR=ON > /dev/null
cmake --build "$dir" -j "$(nproc)" --target zdist
tests/check_abi.sh --update "$dir/libzdist.so" include tests/abi/libzdist.abi
