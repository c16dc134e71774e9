#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# libzdist.so keeps the ABI of 1.0 (docs/conventions.md, "Stability"): its
# ABI, as abidw (abigail-tools) reads it from the library's debug
# information and the public headers, against the committed baseline
# tests/abi/libzdist.abi. Fails, printing abidiff's report, on any change
# but functions added and fields appended to the structs that carry their
# size (tests/abi/libzdist.abignore); builds nothing itself, so the library
# must have debug information (-g: a RelWithDebInfo or Debug build).
#   usage: tests/check_abi.sh LIBZDIST_SO INCLUDE_DIR BASELINE
#          tests/check_abi.sh --update LIBZDIST_SO INCLUDE_DIR BASELINE
#   --update writes the library's ABI as the new baseline instead
#   (tools/abi_baseline.sh: only with a SONAME bump).
set -euo pipefail
update=0
if [ "${1:-}" = --update ]; then update=1; shift; fi
if [ $# -ne 3 ]; then
    echo "usage: $0 [--update] LIBZDIST_SO INCLUDE_DIR BASELINE" >&2
    exit 2
fi
so=$1; inc=$2; baseline=$3
suppr=$(dirname "$baseline")/libzdist.abignore
for tool in abidw abidiff readelf; do
    command -v $tool > /dev/null ||
        { echo "abi: $tool not found (tools/install_deps.sh installs abigail-tools)"; exit 1; }
done
[ -f "$so" ] || { echo "abi: no library at $so"; exit 1; }
[ -d "$inc/zdist" ] || { echo "abi: no headers in $inc/zdist"; exit 1; }
inc=$(cd "$inc" && pwd)
if ! readelf -S --wide "$so" | grep -q '\.debug_info'; then
    echo "abi: $so has no debug information: build it with -g (RelWithDebInfo)"
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The exported functions and the types the public headers define, and
# nothing that depends on where or on what machine the library was built
# (directories, lines, DT_NEEDED).
abidw --headers-dir "$inc/zdist" --drop-private-types --exported-interfaces-only \
      --no-show-locs --short-locs --no-comp-dir-path --no-corpus-path --no-elf-needed \
      --type-id-style hash --out-file "$tmp/current.abi" "$so"
nfn=$(grep -c '<elf-symbol name=.zd_[a-z0-9_]*. type=.func-type.' "$tmp/current.abi" || true)
if [ "$nfn" -lt 200 ]; then
    echo "abi: only $nfn zd_ functions in the ABI of $so: is the API there?"
    exit 1
fi
if [ $update = 1 ]; then
    mkdir -p "$(dirname "$baseline")"
    cp "$tmp/current.abi" "$baseline"
    echo "abi: wrote $baseline ($nfn functions, SONAME $(readelf -d "$so" |
        sed -n 's/.*Library soname: \[\(.*\)\]/\1/p'))"
    exit 0
fi
[ -f "$baseline" ] || { echo "abi: no baseline at $baseline"; exit 1; }

rc=0
abidiff --suppressions "$suppr" --no-added-syms "$baseline" "$tmp/current.abi" \
    > "$tmp/report" 2>&1 || rc=$?
# abidiff's status is a bit field: 1 an error, 2 a usage error, 4 an ABI
# change, 8 one known to be incompatible (a function removed).
if [ $((rc & 3)) -ne 0 ]; then
    cat "$tmp/report"
    echo "abi: abidiff failed (status $rc)"
    exit 1
fi
if [ $((rc & 12)) -ne 0 ]; then
    cat "$tmp/report"
    echo "abi: $so changed the ABI of $(basename "$baseline") (abidiff status $rc):"
    echo "abi: put it back; only a release that bumps the SONAME regenerates the"
    echo "abi: baseline (tools/abi_baseline.sh, docs/conventions.md \"Stability\")"
    exit 1
fi
echo "abi: $so keeps the ABI of $(basename "$baseline") ($nfn functions)"
