#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The library runs on any x86-64 CPU: AVX and AVX-512 instructions appear
# only in the functions that the run-time CPU check dispatches to. The
# ZDIST_CPU=generic tests show the portable path computes right; this shows
# no AVX instruction leaked outside the dispatched functions, where a CPU
# without it would die of SIGILL.
#   usage: tests/check_isa.sh libzdist.so SOURCE_DIR
set -euo pipefail
so=$1; src=$2
# The functions compiled for AVX-512: those defined between NN_AVX512_BEGIN
# and NN_AVX512_END in nn/ (the kernels and the helpers they inline, or not,
# as the compiler and its optimisation level decide). Their callers choose
# them only when the CPU has AVX-512.
allowed=$(awk 'FNR == 1 {inr = 0}
               /^NN_AVX512_BEGIN/ {inr = 1; next}
               /^NN_AVX512_END/ {inr = 0; next}
               inr && /^[A-Za-z_][^;]*\(/ && !/^(typedef|#)/ {
                   s = $0; sub(/^__attribute__\(\([^)]*\)\) */, "", s)
                   sub(/\(.*/, "", s); n = split(s, w, /[ *]+/); print w[n] }' \
          "$src"/nn/*.c "$src"/nn/*.h | sort -u)
[ -n "$allowed" ] || { echo "isa: no NN_AVX512_BEGIN region found in $src/nn"; exit 1; }
bad=0 n=0
while read -r fn; do
  n=$((n + 1))
  if ! grep -qxF -- "$fn" <<< "$allowed"; then
    echo "$fn uses AVX/AVX-512 registers but is not a dispatched kernel"; bad=1
  fi
done < <(objdump -d --no-show-raw-insn "$so" |
         awk '/^[0-9a-f]+ <.*>:$/ {fn = substr($2, 2, length($2) - 3)}
              /%[yz]mm|%k[0-7]|\{%?k[1-7]\}/ {print fn}' | sort -u)
[ $bad -eq 0 ] && echo "isa: $n functions use AVX/AVX-512 registers, all of them dispatched"
[ "$n" -gt 0 ] || { echo "isa: no AVX-512 kernel found: is the dispatch compiled in?"; bad=1; }
exit $bad
