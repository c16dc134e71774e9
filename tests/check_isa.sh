#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The library runs on any x86-64 CPU: AVX, AVX2 and AVX-512 instructions
# appear only in the functions that the run-time CPU check dispatches to.
# The ZDIST_CPU=generic and =avx2 tests show the portable and AVX2 paths
# compute right; this shows no AVX instruction leaked outside the dispatched
# functions, where a CPU without it would die of SIGILL, and no AVX-512 one
# into the AVX2 kernels, which run on CPUs without AVX-512.
#   usage: tests/check_isa.sh libzdist.so SOURCE_DIR
set -euo pipefail
so=$1; src=$2
# The functions defined between NN_AVX512_BEGIN and NN_AVX512_END, and
# between NN_AVX2_BEGIN and NN_AVX2_END, in nn/ (the kernels and the helpers
# they inline, or not, as the compiler and its optimisation level decide),
# as lines "NN_AVX512 name" or "NN_AVX2 name". Their callers choose them
# only when the CPU has those instructions. A region opened inside another
# (which would add its target to the other's) or left open is an error.
regions=$(awk '
    function fail(msg) {print "error " FILENAME ":" FNR ": " msg; failed = 1}
    FNR == 1 && inr {fail("region " inr " left open at the end of the previous file")}
    FNR == 1 {inr = ""}
    /^NN_AVX(512|2)_BEGIN/ {
        if (inr) fail("region opened inside " inr)
        inr = $0; sub(/_BEGIN.*/, "", inr); next}
    /^NN_AVX(512|2)_END/ {
        k = $0; sub(/_END.*/, "", k)
        if (k != inr) fail(k "_END outside its region")
        inr = ""; next}
    inr && /^[A-Za-z_][^;]*\(/ && !/^(typedef|#)/ {
        s = $0; sub(/^__attribute__\(\([^)]*\)\) */, "", s)
        sub(/\(.*/, "", s); n = split(s, w, /[ *]+/); print inr, w[n]}
    END {if (inr) fail("region " inr " left open")}' "$src"/nn/*.c "$src"/nn/*.h | sort -u)
if grep -q '^error ' <<< "$regions"; then
  sed -n 's/^error /isa: /p' <<< "$regions"; exit 1
fi
avx512=$(awk '$1 == "NN_AVX512" {print $2}' <<< "$regions")
avx2=$(awk '$1 == "NN_AVX2" {print $2}' <<< "$regions")
[ -n "$avx512" ] || { echo "isa: no NN_AVX512_BEGIN region found in $src/nn"; exit 1; }
[ -n "$avx2" ] || { echo "isa: no NN_AVX2_BEGIN region found in $src/nn"; exit 1; }
bad=0
# One name in both kinds of region would let either pass for the other.
both=$(comm -12 <(echo "$avx512") <(echo "$avx2"))
for fn in $both; do
  echo "isa: $fn is defined in an NN_AVX2 and an NN_AVX512 region: give each its own name"
  bad=1
done

# Then every function of the library (GCC's clones, name.isra.0 and the
# like, go by their function's name), in one pass over its disassembly:
#   - one that uses vector registers of AVX or later (ymm, zmm, the masks
#     k0-k7, or a VEX/EVEX form on xmm) must be in a region;
#   - one in an NN_AVX2 region must use nothing only AVX-512 has (zmm,
#     masks, xmm/ymm16-31) and call (or jump to) no function of an
#     NN_AVX512 region.
set +e
objdump -d --no-show-raw-insn "$so" |
  awk -v avx512="$avx512" -v avx2="$avx2" '
    BEGIN {
        n = split(avx512, l, "\n"); for (i = 1; i <= n; i++) is512[l[i]] = 1
        n = split(avx2, l, "\n"); for (i = 1; i <= n; i++) is2[l[i]] = 1
    }
    function report(msg) {if (!(msg in said)) {print msg; said[msg] = 1; bad = 1}}
    /^[0-9a-f]+ <.*>:$/ {fn = substr($2, 2, length($2) - 3); sub(/\..*/, "", fn); next}
    !fn {next}
    /%[yz]mm|%k[0-7]/ || /^ *[0-9a-f]+:\t+v[a-z0-9]+ .*%xmm/ {
        if (!(fn in vec)) {vec[fn] = 1; nvec++; if (fn in is2) navx2++}
        if (!(fn in is512) && !(fn in is2))
            report(fn " uses AVX registers or instructions but is not a dispatched kernel")
    }
    (fn in is2) && /%zmm|%k[0-7]|\{%?k[1-7]\}|%[xy]mm(1[6-9]|2[0-9]|3[01])/ {
        report(fn " is an AVX2 kernel but uses AVX-512 registers")
    }
    # calls, and jumps to another function (tail calls)
    (fn in is2) && /^ *[0-9a-f]+:\t+(call|j[a-z]+) +[0-9a-f]+ </ {
        t = $0; sub(/.*</, "", t); sub(/[>+@].*/, "", t); sub(/\..*/, "", t)
        if (t != fn && (t in is512))
            report(fn " is an AVX2 kernel but calls " t ", compiled for AVX-512")
    }
    END {
        if (!nvec) report("isa: no AVX kernel found: is the dispatch compiled in?")
        else if (!navx2) report("isa: no AVX2 kernel found: are the NN_AVX2 regions compiled in?")
        if (!bad)
            print "isa: " nvec " functions use AVX registers or instructions, all of them " \
                  "dispatched; the " navx2 " AVX2 ones use no AVX-512 register and call no " \
                  "AVX-512 function"
        exit bad
    }'
[ $? -eq 0 ] || bad=1
exit $bad
