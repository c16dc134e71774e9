#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs, on Debian, every package the build, the tests and the default data
# need. Quick when everything is already there: apt is only run for what is
# missing. build-essential brings cc, c++ (the consumer test builds a C++
# program against the installed headers) and binutils (readelf); cmake and
# pkg-config serve the build and the consumer test alike. slurm-wlm, munge
# and openmpi-bin run the launcher tests (tests/slurm.sh, tests/mpirun.sh).
set -euo pipefail
pkgs=(build-essential cmake pkg-config libzmq3-dev libczmq-dev libopenblas-dev
      libcmocka-dev zlib1g-dev dataset-fashion-mnist clang libclang-rt-14-dev
      slurm-wlm munge openmpi-bin)
# srun --mpi=pmix (tests/slurm.sh) opens libpmix.so, which only the -dev
# package provides
pkgs+=(libpmix-dev)
# A static link of libzdist.a (tests/consumer, zdist-static.pc) takes
# libxml2's -llzma, behind libzmq's norm
pkgs+=(liblzma-dev)
# and OpenBLAS's -lgfortran (openblas.pc), which only gfortran's -dev brings
pkgs+=(gfortran)
pkgs+=(libjansson-dev)   # the library parses safetensors headers with it, metrics_summary its JSON lines
# tests/test_safetensors moves files between zdist and PyTorch (tools/safetensors/st.py)
pkgs+=(python3-torch)
pkgs+=(iproute2)         # test_launch_nodes puts two "nodes" in network namespaces
pkgs+=(debootstrap)      # tools/test.sh runs the Release stage in a fresh root
pkgs+=(gcovr)            # tools/coverage.sh
pkgs+=(clang-format)     # tests/check_format.sh holds the sources to .clang-format
pkgs+=(python3)          # tools/comment_style.py (check_comments) holds them to one comment style
pkgs+=(abigail-tools)    # tests/check_abi.sh: abidw and abidiff hold libzdist.so to the 1.0 ABI
# cairo and a font draw the example programs' --curves plots
pkgs+=(libcairo2-dev fonts-dejavu-core)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing: ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO apt-get update
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
