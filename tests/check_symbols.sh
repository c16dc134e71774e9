#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The installed libraries define no global symbol but the public zd_ API:
# nothing internal (zd__…) and nothing unprefixed can clash with a user's
# own symbols, in the shared library or in the static archive.
# And every function a public header declares is exported.
#   usage: tests/check_symbols.sh libzdist.so libzdist.a INCLUDE_DIR
set -euo pipefail
so=$1; ar=$2; inc=$3
bad=0
check() {  # $1: what, stdin: symbol names
  local what=$1 n=0 s
  while read -r s; do
    n=$((n + 1))
    if [[ ! "$s" =~ ^zd_[a-z0-9] ]]; then echo "$what exports $s"; bad=1; fi
  done
  echo "$what: $n global symbols"
  [ "$n" -gt 200 ] || { echo "$what: too few symbols, is the API there?"; bad=1; }
}
nm -D --defined-only "$so" | awk '$2 ~ /[TDBRVW]/ {print $3}' | check "$(basename "$so")"
nm -g --defined-only "$ar" 2>/dev/null | awk 'NF == 3 {print $3}' | check "$(basename "$ar")"
missing=$(comm -13 <(nm -D --defined-only "$so" | awk '{print $3}' | sort -u) \
                   <(sed -n 's/^ZD_API [^(]*[ *]\(zd_[a-z0-9_]*\)(.*/\1/p' "$inc"/zdist/*.h | sort -u))
if [ -n "$missing" ]; then echo "declared ZD_API but not exported: $missing"; bad=1; fi
exit $bad
