#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs what is missing, builds, and runs the main job: the parameter-
# server tutorial as a local world of one server and three trainers
# (build/tools/launch starts the four rpc_ps processes and labels their
# output) on the default data: Fashion-MNIST from Debian's
# dataset-fashion-mnist, or ./data when it holds MNIST-format files.
# Extra arguments go to every rpc_ps process (e.g. --max_batches=200).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j "$(nproc)"
exec build/tools/launch --nproc=4 -- build/examples/rpc_ps "$@"
