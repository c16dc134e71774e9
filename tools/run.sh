#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job: training the
# tutorial Net in one process on the default data (Fashion-MNIST from Debian's
# dataset-fashion-mnist, or ./data when it holds MNIST-format files).
# Extra arguments go to the training program (e.g. --max_batches=200).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j "$(nproc)"
exec build/examples/train_local "$@"
