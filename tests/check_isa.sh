#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The library runs on any x86-64 CPU: AVX and AVX-512 instructions appear
# only in the functions that the run-time CPU check dispatches to. The
# ZDIST_CPU=generic tests show the portable path computes right; this shows
# no AVX instruction leaked outside the dispatched functions, where a CPU
# without it would die of SIGILL.
#   usage: tests/check_isa.sh libzdist.so
set -euo pipefail
so=$1
# Dispatched kernels are named *_avx512. The stride-1 "taps" convolution
# path (nn/conv_taps.c, conv_sparse.c, conv_outgrad.c) is taken only when
# zd__nn_taps_enabled() found AVX-512, so all of it is compiled for it.
allowed='_avx512$|^zd__conv_(taps|sparse|out)_|^(plain_grads|planes_to_rows|rows_to_planes|winners_dw)$'
bad=0 n=0
while read -r fn; do
  n=$((n + 1))
  if [[ ! "$fn" =~ $allowed ]]; then
    echo "$fn uses AVX/AVX-512 registers but is not a dispatched kernel"; bad=1
  fi
done < <(objdump -d --no-show-raw-insn "$so" |
         awk '/^[0-9a-f]+ <.*>:$/ {fn = substr($2, 2, length($2) - 3)}
              /%[yz]mm|%k[0-7]|\{%?k[1-7]\}/ {print fn}' | sort -u)
[ $bad -eq 0 ] && echo "isa: $n functions use AVX/AVX-512 registers, all of them dispatched"
[ "$n" -gt 0 ] || { echo "isa: no AVX-512 kernel found: is the dispatch compiled in?"; bad=1; }
exit $bad
