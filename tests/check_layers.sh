#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The layers' include arrows point down only. Each folder may include the
# public headers of the layers below it (and its own), and private headers
# of its own folder only, and of core/, the floor every layer stands on
# (the log's writer, large tensors' memory, fault injection, sized structs).
# core/ itself includes no other layer's header, public or private.
# Inside rpc/, the rooms (rpc/README.md) have an order of their own,
# value < net < world < agent: a file of a room may include the private
# headers of its own room and of the rooms below it, and none above.
# A file at rpc/'s top level is in no room yet and stands above them all;
# no room may include its headers.
#   usage: tests/check_layers.sh SOURCE_DIR
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
# public headers each layer may include (rpc/: tensors as values, never
# the autograd engine, so that a first include of it is caught)
declare -A allowed=(
  [core]="error version export log rng strings"
  [autograd]="error version export log strings rng tensor autograd function scope named_tensors"
  [data]="error version export log strings rng tensor autograd function scope named_tensors idx dataset checkpoint safetensors"
  [rpc]="error version export log strings tensor rpc value future"
  [dist_autograd]="error version export log strings tensor autograd function named_tensors rpc value future dist_autograd"
  [nn]="error version export log strings tensor autograd function named_tensors nn model dataset idx checkpoint safetensors rng module rnn"
  [optim]="error version export log strings tensor autograd function named_tensors optim"
  [dist_optim]="error version export log strings tensor autograd function named_tensors rpc value future dist_autograd optim dist_optim"
  [dist_nn]="error version export log strings tensor autograd function named_tensors rpc value future dist_autograd nn model dataset idx checkpoint safetensors rng module rnn dist_nn"
  [ps]="error version export log strings tensor autograd function scope named_tensors rpc value future dist_autograd nn model dataset idx checkpoint safetensors rng module rnn optim dist_optim dist_nn ps"
)
# the public headers: which layer each belongs to
declare -A home=(
  [error]=core [strings]=core [log]=core [version]=core [export]=core [rng]=core [tensor]=autograd [autograd]=autograd
  [function]=autograd [named_tensors]=autograd [rnn]=nn [rpc]=rpc [value]=rpc [future]=rpc [dist_autograd]=dist_autograd
  [nn]=nn [model]=nn [dataset]=data [idx]=data [checkpoint]=data [safetensors]=data [optim]=optim
  [dist_optim]=dist_optim [module]=nn [dist_nn]=dist_nn [scope]=autograd [ps]=ps)
bad=0
for layer in "${!allowed[@]}"; do
  for f in $(find "$layer" -name '*.[ch]' | sort); do
    while IFS= read -r inc; do
      case "$inc" in
        '<zdist/'*)
          h=${inc#<zdist/}; h=${h%.h>}
          if [[ " ${allowed[$layer]} " != *" $h "* ]]; then
            echo "$f includes <zdist/$h.h> of layer ${home[$h]:-?}, above $layer"; bad=1
          fi ;;
        '"'*)
          p=${inc#\"}; p=${p%\"}
          if [[ "$p" == */* && "${p%%/*}" != "$layer" && "${p%%/*}" != core ]]; then
            echo "$f includes the private header $p of another layer"; bad=1
          fi ;;
      esac
    done < <(sed -n 's/^#include \([<"][^>"]*[>"]\).*/\1/p' "$f")
  done
done
# rpc/'s rooms, bottom up; the top level (no room yet) above them all
declare -A room_rank=([value]=0 [net]=1 [world]=2 [agent]=3)
room_of() {   # rpc/net/io.c -> net; rpc/x.c (top level) -> "" (no room)
  local rest=${1#rpc/}
  [[ "$rest" == */* ]] && echo "${rest%%/*}" || echo ""
}
rank_of() {   # a room's rank; the top level, 4
  [ -z "$1" ] && echo 4 || echo "${room_rank[$1]:-9}"
}
for f in $(find rpc -name '*.[ch]' | sort); do
  r=$(room_of "$f")
  if [ -n "$r" ] && [ -z "${room_rank[$r]:-}" ]; then
    echo "$f is in rpc/$r/, which is not one of rpc/'s rooms (value net world agent)"; bad=1; continue
  fi
  while IFS= read -r p; do
    [[ "$p" == rpc/* ]] || continue
    ir=$(room_of "$p"); irn=${ir:-none, the top level}
    if [ "$(rank_of "$ir")" -gt "$(rank_of "$r")" ]; then
      echo "$f (room ${r:-none}) includes $p of room $irn, above it"; bad=1
    fi
  done < <(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f")
done
# Below agent/, nothing takes the agent: no file of value/, net/ or world/
# names its type agent_t (not even through a declaration of its own, which
# the include arrows would not see). net/ reaches up only through the hooks
# the agent installs on zd__net_t (rpc/net/net.h).
for f in $(find rpc/value rpc/net rpc/world -name '*.[ch]' | sort); do
  if grep -Eq '\bagent_t\b|\bstruct agent\b' "$f"; then
    echo "$f (room $(room_of "$f")) names agent_t, the agent's type: only agent/ may"; bad=1
  fi
done
# rpc/README.md's table of files is rpc/'s map: it names the same .c
# files, in the same rooms, as rpc/CMakeLists.txt builds, and those are
# the .c files there are.
built=$(grep -o '[a-z_]*/[a-z_]*\.c' rpc/CMakeLists.txt | sort -u)
mapped=$(sed -n 's/^| \([a-z]*\) | `\([a-z_]*\.c\)` |.*/\1\/\2/p' rpc/README.md | sort -u)
present=$(cd rpc && find . -name '*.c' | sed 's|^\./||' | sort -u)
while IFS= read -r c; do
  [ -n "$c" ] && { echo "rpc/$c is built by rpc/CMakeLists.txt but not in rpc/README.md's table"; bad=1; }
done < <(comm -23 <(echo "$built") <(echo "$mapped"))
while IFS= read -r c; do
  [ -n "$c" ] && { echo "rpc/README.md's table lists rpc/$c, which rpc/CMakeLists.txt does not build"; bad=1; }
done < <(comm -13 <(echo "$built") <(echo "$mapped"))
while IFS= read -r c; do
  [ -n "$c" ] && { echo "rpc/$c is not built by rpc/CMakeLists.txt"; bad=1; }
done < <(comm -13 <(echo "$built") <(echo "$present"))
# public headers: the same rule
for f in include/zdist/*.h; do
  h=$(basename "$f" .h)
  [ "$h" = zdist ] && continue   # the umbrella header: every layer, on purpose
  layer=${home[$h]}
  while IFS= read -r inc; do
    i=${inc#<zdist/}; i=${i%.h>}
    if [[ " ${allowed[$layer]} " != *" $i "* ]]; then
      echo "$f (layer $layer) includes <zdist/$i.h> of layer ${home[$i]:-?}"; bad=1
    fi
  done < <(sed -n 's/^#include \(<zdist\/[^>]*>\).*/\1/p' "$f")
done
# The example programs are written as a user would write them: the public
# headers and their own files only.
for f in examples/*.[ch]; do
  while IFS= read -r p; do
    if [[ "$p" == */* && "${p%%/*}" != examples ]]; then
      echo "$f includes the private header $p: examples use the public headers only"; bad=1
    fi
  done < <(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f")
done
[ $bad -eq 0 ] && echo "layers: every include points down, within rpc/'s rooms too; examples use the public headers"
exit $bad
