#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# rpc_ps under Open MPI's mpirun, with nothing but its variables and
# MASTER_PORT to go on:
#     mpirun --allow-run-as-root --oversubscribe -np 4 rpc_ps --max_batches=50
# checks that it exits 0 with four ranks that took their rank from
# OMPI_COMM_WORLD_RANK and their master from "the whole world is on this
# host" (OMPI_COMM_WORLD_LOCAL_SIZE), and the trainers' accuracy lines.
#   usage: tests/mpirun.sh BUILD_DIR     (ctest passes it)
# Exits 77 (skipped) when mpirun is missing (Debian package openmpi-bin;
# tools/install_deps.sh installs it).
#
# MASTER_PORT is a free port the kernel hands out, held by free_port until
# this script exits, so that tests running side by side do not meet and no
# connection's local end (a trainer's own, made before rank 0 listens)
# takes it. The port zd_rpc_env_resolve derives from Open MPI's job id when
# MASTER_PORT is unset is checked by test_rpc_env.
set -euo pipefail
build=${1:?usage: tests/mpirun.sh BUILD_DIR}
skip() { echo "SKIP: $*"; exit 77; }
command -v mpirun > /dev/null ||
  skip "mpirun is missing (Debian package openmpi-bin; tools/install_deps.sh)"
mpirun --version 2>/dev/null | grep -q "Open MPI" || skip "mpirun is not Open MPI's"
rpc_ps=$build/examples/rpc_ps
free_port=$build/tests/support/free_port
[ -x "$rpc_ps" ] && [ -x "$free_port" ] || { echo "build rpc_ps and free_port first"; exit 1; }
out=$(mktemp /tmp/zdist-mpirun.XXXXXX)
trap 'rm -f "$out"' EXIT

unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR ZDIST_MASTER_PORT
export MASTER_PORT=$("$free_port" 1 $$) ZDIST_LOG_LEVEL=info OPENBLAS_NUM_THREADS=1
start=$SECONDS
root=()
[ "$(id -u)" -ne 0 ] || root=(--allow-run-as-root)
fail() { echo "FAIL: $*"; cat "$out"; exit 1; }
rc=0
timeout 600 mpirun "${root[@]}" --oversubscribe -np 4 -x MASTER_PORT -x ZDIST_LOG_LEVEL \
  -x OPENBLAS_NUM_THREADS "$rpc_ps" --max_batches=50 --eval_samples=1000 > "$out" 2>&1 || rc=$?
[ $rc -eq 0 ] || fail "mpirun exited with $rc"
n=$(grep -c "joining a world of 4" "$out" || true)
[ "$n" -eq 4 ] || fail "$n of 4 ranks started"
for r in 0 1 2 3; do
  grep -q "rpc: rank $r of 4 from OMPI_COMM_WORLD_RANK, world size from OMPI_COMM_WORLD_SIZE, local rank $r from OMPI_COMM_WORLD_LOCAL_RANK, master 127.0.0.1:$MASTER_PORT from OMPI_COMM_WORLD_LOCAL_SIZE/MASTER_PORT \[openmpi\]" "$out" ||
    fail "no start line of rank $r with master 127.0.0.1:$MASTER_PORT"
done
n=$(grep -cE "^Rank [123] test accuracy [0-9.]+ %" "$out" || true)
[ "$n" -eq 3 ] || fail "$n of 3 trainers' accuracy lines"
grep -m1 "rpc: rank 0 of 4" "$out" | sed 's/^.*rpc: /  /'
echo "mpirun -np 4 rpc_ps: ok in $((SECONDS - start)) s"
