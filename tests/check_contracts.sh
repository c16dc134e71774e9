#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# One ownership rule for what a public function hands back (docs/
# conventions.md, "Ownership"): every ZD_API function that returns a
# pointer, or fills a pointer-to-pointer out-parameter, says in its
# contract comment whose the result is, in the rule's words: "new
# reference", "new object", "caller frees", "borrowed" or "static".
# Destructors (_free, _unref and their variants) hand nothing back and are
# not checked.
#
# What hands back something new (a new reference, a new object, memory the
# caller frees) allocates, so it can fail: its contract also says how,
# with -1, NULL or a failure ("0, or -1", "or NULL", "fails when ...").
# Accessors handing back borrowed or static pointers are left to the rule
# for a miss (docs/conventions.md, "Errors").
#
# The types of functions the caller passes in (typedef ... (zd_..._fn) or
# (*zd_..._fn)) have a contract too: when they are called and what they
# return.
#
# The contract of a declaration is the comment block right above it (one
# block may serve a run of declarations with no blank line between them),
# plus a comment at the end of the declaration itself. Each offender is
# reported as file:line: name.
#   usage: tests/check_contracts.sh [INCLUDE_DIR]
set -euo pipefail
inc=${1:-$(dirname "$0")/../include}
shopt -s nullglob
headers=("$inc"/zdist/*.h)
if [ ${#headers[@]} -eq 0 ]; then
    echo "contracts: no headers in $inc/zdist"
    exit 1
fi
awk '
  FNR == 1 { contract = ""; incomment = 0; collecting = 0 }
  incomment {
      text = text " " $0
      if ($0 ~ /\*\//) { incomment = 0; contract = text }
      next
  }
  collecting {
      decl = decl " " $0
      if ($0 ~ /;/) { collecting = 0; check() }
      next
  }
  /^[ \t]*\/\*/ {   # a comment on a line of its own: the contract of what follows
      text = $0
      if ($0 ~ /\*\//) contract = text; else incomment = 1
      next
  }
  /^typedef[^(]*\(\*?[ \t]*zd_[a-z0-9_]+_fn[ \t]*\)/ {
      nfn++
      name = $0; sub(/^[^(]*\(\*?[ \t]*/, "", name); sub(/[ \t]*\).*/, "", name)
      if (contract == "" && !index($0, "/*")) {
          printf "%s:%d: %s, a callback type, has no contract comment\n", FILENAME, FNR, name
          nbad++
      }
      contract = ""
      next
  }
  /^ZD_API/ {
      decl = $0; line = FNR
      if ($0 ~ /;/) check(); else collecting = 1
      next
  }
  { contract = "" }   # a blank line or anything else ends the run it served
  function check(   name, said, ret, out) {
      ndecl++
      name = decl; sub(/\(.*/, "", name); sub(/.*[ *]/, "", name)
      if (name ~ /_(free|unref)(_[a-z]+)?$/)
          return
      ret = decl ~ /^ZD_API[^(]*\*[ \t]*zd_[a-z0-9_]+[ \t]*\(/
      out = decl ~ /\*[ \t]*\*+[ \t]*[a-z0-9_]*[ \t]*[,)]/
      if (!ret && !out)
          return
      nptr++
      said = contract
      if (index(decl, "/*"))
          said = said " " substr(decl, index(decl, "/*"))
      said = tolower(said)
      gsub(/[ \t]+\*?[ \t]*/, " ", said)   # words split over comment lines
      if (said !~ /new reference|new object|caller frees|borrowed|static/) {
          printf "%s:%d: %s says nothing of who owns what it hands back\n", FILENAME, line, name
          nbad++
      }
      if (said ~ /new reference|new object|caller frees/) {
          nnew++
          if (said !~ /-1|null|fail/) {
              printf "%s:%d: %s hands back something new but says nothing of how it fails\n", FILENAME, line, name
              nbad++
          }
      }
  }
  END {
      if (ndecl == 0) {
          print "contracts: no ZD_API declaration found: is this the include directory?"
          exit 1
      }
      if (nptr == 0) {
          print "contracts: no function hands back a pointer: the parser is broken"
          exit 1
      }
      if (nfn == 0) {
          print "contracts: no callback type (zd_..._fn) found: the parser is broken"
          exit 1
      }
      if (nbad) {
          printf "contracts: %d problems in the contracts of %d functions and %d callback types\n", nbad, ndecl, nfn
          exit 1
      }
      printf "contracts: all %d functions that hand back a pointer (of %d) say whose it is, the %d that hand back something new say how they fail, and the %d callback types have a contract\n", nptr, ndecl, nnew, nfn
  }' "${headers[@]}"
