#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Proves an installed zdist is usable by other programs. Builds the programs
# of tests/consumer (add.c, add.cpp) as a user would, runs each, and fails
# at the first thing that does not work:
#   1. with pkg-config: cc and c++ against libzdist.so, cc against libzdist.a
#      (pkg-config --static);
#   2. with CMake: find_package(zdist) in tests/consumer (zdist::zdist and
#      zdist::zdist_static);
#   3. the installed tree moved elsewhere: no file names the old prefix, and
#      pkg-config and find_package still work;
#   4. add_subdirectory: tests/consumer/subdir builds zdist from source as
#      part of its own project, with cmocka hidden from pkg-config;
#   5. (between 2 and 3) examples/ built as a project of its own against
#      the install, as a user copying an example would.
#   usage: tests/consumer/run.sh PREFIX     (after cmake --install BUILD --prefix PREFIX)
set -euo pipefail
if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 PREFIX (an installed zdist)" >&2; exit 2
fi
prefix=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
jobs=$(nproc)
work=$(mktemp -d)
current=setup
finish() {
  local rc=$?
  rm -rf "$work"
  [ $rc -eq 0 ] || echo "consumer: FAILED in: $current" >&2
}
trap finish EXIT
unset LD_LIBRARY_PATH
step() { current=$*; echo "--- consumer: $*"; }

# The library directory (lib, lib64 or lib/<multiarch>) is where zdist.pc is.
pc=$(find "$prefix" -path '*/pkgconfig/zdist.pc' -print -quit)
[ -n "$pc" ] || { echo "consumer: no pkgconfig/zdist.pc under $prefix" >&2; exit 1; }
use_prefix() {  # $1: an installed zdist; sets PKG_CONFIG_PATH and libdir
  PKG_CONFIG_PATH="$1/${pc#"$prefix"/}"
  export PKG_CONFIG_PATH=${PKG_CONFIG_PATH%/zdist.pc}
  libdir=$(pkg-config --variable=libdir zdist)
}

# Runs a program linked to libzdist.so, checking first that it is the
# library under $libdir that it loads.
run_shared() {  # $1: program
  local so
  so=$(LD_LIBRARY_PATH=$libdir ldd "$1" | awk '$1 ~ /^libzdist\.so/ {print $3}')
  [ "$(realpath "$so")" = "$(realpath "$libdir"/libzdist.so)" ] ||
    { echo "consumer: $1 loads '$so', not $libdir/libzdist.so" >&2; return 1; }
  LD_LIBRARY_PATH=$libdir "$1"
}
# Runs a program linked to libzdist.a: it must not need libzdist.so at all.
run_static() {  # $1: program
  if readelf -d "$1" | grep -q 'NEEDED.*libzdist'; then
    echo "consumer: $1 needs libzdist.so" >&2; return 1
  fi
  "$1"
}

# pkg-config --static --libs zdist-static gives libzdist.a's dependencies;
# two edits make the linker take the archive: -lzdist would pick
# libzdist.so, which sits beside it, so it becomes -l:libzdist.a; and
# Debian 12's norm.pc (needed by libzmq) names a bare "libprotokit.a",
# which becomes -l:libprotokit.a.
static_libs() {
  local f out=()
  for f in $(pkg-config --static --libs zdist-static); do
    case $f in
      -lzdist) out+=(-l:libzdist.a) ;;
      lib*.a) out+=("-l:$f") ;;
      *) out+=("$f") ;;
    esac
  done
  echo "${out[@]}"
}

use_prefix "$prefix"
echo "consumer: zdist $(pkg-config --modversion zdist) in $prefix ($libdir)"

step "pkg-config: zdist.pc needs no other package's .pc (no -dev package of a dependency)"
# Hide every other .pc file: --cflags and --libs must still answer.
mkdir -p "$work/pc-alone"
cp "$pc" "$work/pc-alone/"
PKG_CONFIG_LIBDIR="$work/pc-alone" PKG_CONFIG_PATH="" pkg-config --cflags --libs zdist > /dev/null

step "zdist-keygen is installed and makes a key"
"$prefix/bin/zdist-keygen" "$work/world.key" > /dev/null
[ "$(stat -c %a "$work/world.key")" = 600 ]

step "pkg-config: cc, libzdist.so"
# shellcheck disable=SC2046  # pkg-config's output is a list of flags
cc -std=c11 -Wall -Wextra -Wpedantic -Werror $(pkg-config --cflags zdist) \
   "$here/add.c" -o "$work/pc_add_c" $(pkg-config --libs zdist)
run_shared "$work/pc_add_c"

step "pkg-config: c++, libzdist.so"
# shellcheck disable=SC2046
c++ -std=c++11 -Wall -Wextra -Wpedantic -Werror $(pkg-config --cflags zdist) \
    "$here/add.cpp" -o "$work/pc_add_cpp" $(pkg-config --libs zdist)
run_shared "$work/pc_add_cpp"

step "pkg-config --static: cc, libzdist.a"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Wpedantic -Werror $(pkg-config --cflags zdist) \
   "$here/add.c" -o "$work/pc_add_c_static" $(static_libs)
run_static "$work/pc_add_c_static"

step "find_package(zdist): configure and build tests/consumer"
cmake -S "$here" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
      > "$work/cmake.log" || { cat "$work/cmake.log"; false; }
cmake --build "$work/cmake" -j "$jobs" > "$work/build.log" || { cat "$work/build.log"; false; }
step "find_package(zdist): run add_c, add_cpp (zdist::zdist), add_c_static (zdist::zdist_static)"
run_shared "$work/cmake/add_c"
run_shared "$work/cmake/add_cpp"
run_static "$work/cmake/add_c_static"

step "examples/ as a project of its own against the install: build, rpc_ps --help"
cmake -S "$src/examples" -B "$work/examples" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS=-Werror > "$work/cmake.log" ||
  { cat "$work/cmake.log"; false; }
cmake --build "$work/examples" -j "$jobs" > "$work/build.log" || { cat "$work/build.log"; false; }
LD_LIBRARY_PATH=$libdir "$work/examples/rpc_ps" --help > "$work/help.txt" 2>&1
grep -q -- "--world_size" "$work/help.txt"

step "relocation: the installed tree copied elsewhere"
cp -a "$prefix" "$work/moved"
if grep -rl --binary-files=text -F "$prefix" "$work/moved"; then
  echo "consumer: the files above name the install prefix $prefix" >&2; false
fi
use_prefix "$work/moved"
# shellcheck disable=SC2046
cc $(pkg-config --cflags zdist) "$here/add.c" -o "$work/moved_add_c" $(pkg-config --libs zdist)
run_shared "$work/moved_add_c"
cmake -S "$here" -B "$work/cmake-moved" -DCMAKE_PREFIX_PATH="$work/moved" \
      -DCMAKE_BUILD_TYPE=Release > "$work/cmake.log" || { cat "$work/cmake.log"; false; }
grep -q "zdist_DIR:PATH=$work/moved/" "$work/cmake-moved/CMakeCache.txt"
cmake --build "$work/cmake-moved" -j "$jobs" --target add_c_static > "$work/build.log" ||
  { cat "$work/build.log"; false; }
run_static "$work/cmake-moved/add_c_static"

step "add_subdirectory: configure tests/consumer/subdir without cmocka"
# A pkg-config search path holding every system .pc file but cmocka's.
mkdir "$work/pc-no-cmocka"
for d in $(pkg-config --variable=pc_path pkg-config | tr : ' '); do
  for f in "$d"/*.pc; do
    [ -e "$f" ] && [ "${f##*/}" != cmocka.pc ] && [ ! -e "$work/pc-no-cmocka/${f##*/}" ] &&
      ln -s "$f" "$work/pc-no-cmocka/"
  done
done
if PKG_CONFIG_LIBDIR=$work/pc-no-cmocka pkg-config --exists cmocka; then
  echo "consumer: could not hide cmocka" >&2; false
fi
PKG_CONFIG_LIBDIR=$work/pc-no-cmocka PKG_CONFIG_PATH='' \
  cmake -S "$here/subdir" -B "$work/subdir" -DZDIST_SOURCE_DIR="$src" -DCMAKE_BUILD_TYPE=Release \
  > "$work/cmake.log" || { cat "$work/cmake.log"; false; }
for d in tests examples bench tools; do
  [ ! -e "$work/subdir/zdist/$d" ] || { echo "consumer: add_subdirectory built zdist's $d/" >&2; false; }
done
step "add_subdirectory: build and run (libzdist.so from the build tree)"
cmake --build "$work/subdir" -j "$jobs" > "$work/build.log" || { cat "$work/build.log"; false; }
"$work/subdir/add_c"
"$work/subdir/add_cpp"
run_static "$work/subdir/add_c_static"

echo "consumer: all passed"
