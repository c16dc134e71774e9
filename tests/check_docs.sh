#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# check_docs.sh: every C example of the user's guide compiles, and the
# tutorial's programs build and run.
#
#   check_docs.sh SOURCE_DIR BUILD_DIR             the C blocks of README.md and docs/*.md
#   check_docs.sh --tutorial SOURCE_DIR BUILD_DIR  build docs/tutorial/*.c against
#                                                  the build tree and run them
#
# Every fenced block whose info string starts with "c" (```c ...) is
# compiled with the public headers only (-I SOURCE_DIR/include), as
# -std=gnu11 -Wall -Wextra -Werror. The words after "c" say how:
#
#   ```c program    a whole program: compiled as it is and linked against
#                   BUILD_DIR/libzdist.a and its dependencies (not run).
#                   A block containing "int main(" is a program even unmarked.
#   ```c decl       file-scope code (handlers, helper functions, types):
#                   compiled with -c after the prelude.
#   ```c fragment   statements: compiled with -c after the prelude, inside
#                   the body of a function returning int. The default for a
#                   block without "int main(".
#   file=PATH       (with program) the block must be byte for byte the file
#                   docs/PATH, the real file the page shows.
#   ```c nocompile  refused: every block compiles.
#
# The prelude is <zdist/zdist.h> when include/zdist/zdist.h exists, else
# every public header, plus <stdio.h>, <stdlib.h>, <string.h>, <math.h>,
# <inttypes.h>. A fragment or decl that uses names it does not define gets
# them from an HTML comment on the line just above its fence, which renders
# as nothing:
#
#   <!-- context: static zd_tensor_t *loss; static int64_t ctx; -->
#
# whose text is put at file scope before the block. Fragments and decls are
# excerpts, so they are compiled with -Wno-unused-variable,
# -Wno-unused-but-set-variable and -Wno-unused-function.
#
# Besides compiling: every docs/tutorial/*.c must be shown by a file= block,
# and the pages (README.md and every docs/*.md, the maintainers' note too) may
# name only zd_/ZD_ identifiers that the public headers declare, and must not
# cite the SPEC.
#
# Environment: CC (cc), ZD_DOCS_CFLAGS (extra compile and link flags, e.g.
# the sanitizers' when the library was built with them), ZD_DOCS_LIBS (the
# link line after libzdist.a; default: pkg-config --libs libzmq libczmq
# openblas zlib jansson, then -lpthread -lm -ldl).
set -u
exec 2>&1   # one stream, in order, for ctest's log

tutorial=0
if [ "${1:-}" = "--tutorial" ]; then
    tutorial=1
    shift
fi
if [ $# -ne 2 ]; then
    echo "usage: $0 [--tutorial] SOURCE_DIR BUILD_DIR" >&2
    exit 2
fi
src=$(cd "$1" && pwd) || exit 2
build=$(cd "$2" && pwd) || exit 2
cc=${CC:-cc}
read -r -a extra_flags <<< "${ZD_DOCS_CFLAGS:-}"
if [ -n "${ZD_DOCS_LIBS:-}" ]; then
    read -r -a libs <<< "$ZD_DOCS_LIBS"
else
    read -r -a libs <<< "$(pkg-config --libs libzmq libczmq openblas zlib jansson) -lpthread -lm -ldl"
fi
lib="$build/libzdist.a"
if [ ! -f "$lib" ]; then
    echo "check_docs: $lib not found (build the zdist_static target first)" >&2
    exit 1
fi
cflags=(-std=gnu11 -O2 -Wall -Wextra -Werror -I "$src/include" "${extra_flags[@]}")
tmp=$(mktemp -d "${TMPDIR:-/tmp}/check_docs.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

# ---- --tutorial: build docs/tutorial/*.c and run them as 2-process worlds ----

if [ $tutorial = 1 ]; then
    launch="$build/tools/launch"
    [ -x "$launch" ] || { echo "check_docs: $launch not found" >&2; exit 1; }
    fail=0
    for prog in add split; do
        if ! "$cc" "${cflags[@]}" -o "$tmp/$prog" "$src/docs/tutorial/$prog.c" "$lib" "${libs[@]}"; then
            echo "FAIL: docs/tutorial/$prog.c does not build" >&2
            exit 1
        fi
        if ! timeout 120 "$launch" --nproc=2 --no_rank_flags --timeout_s=100 -- "$tmp/$prog" \
                > "$tmp/$prog.out" 2>&1; then
            cat "$tmp/$prog.out"
            echo "FAIL: docs/tutorial/$prog.c: the world failed" >&2
            exit 1
        fi
        cat "$tmp/$prog.out"
    done
    # add: rank 0 prints the sum computed by worker1.
    if ! grep -q '^\[rank 0\] add(2, 3) on worker1 = 5$' "$tmp/add.out"; then
        echo "FAIL: add did not print 'add(2, 3) on worker1 = 5'" >&2
        fail=1
    fi
    # split: "step N loss L" lines from rank 0; the loss goes down.
    grep '^\[rank 0\] step ' "$tmp/split.out" | awk '
        { loss[n++] = $NF + 0 }
        END {
            if (n < 20) { printf "FAIL: split printed %d steps, expected 20\n", n; exit 1 }
            for (i = 1; i < n; i++)
                if (loss[i] > loss[i - 1]) {
                    printf "FAIL: split: loss went up at step %d (%g -> %g)\n", i + 1, loss[i - 1], loss[i]
                    exit 1
                }
            if (!(loss[n - 1] < 0.5 * loss[0])) {
                printf "FAIL: split: loss %g -> %g, expected at least halved\n", loss[0], loss[n - 1]
                exit 1
            }
            printf "split: loss %g -> %g over %d steps\n", loss[0], loss[n - 1], n
        }' || fail=1
    [ $fail = 0 ] || exit 1

    # The page's other two ways, against the build tree installed into a
    # temporary prefix: docs/tutorial/CMakeLists.txt (find_package) and the
    # pkg-config line. Each program is built; add is run.
    cmake=${CMAKE_COMMAND:-cmake}
    prefix="$tmp/prefix"
    if ! "$cmake" --install "$build" --prefix "$prefix" > "$tmp/install.log" 2>&1; then
        cat "$tmp/install.log"
        echo "FAIL: cmake --install of the build tree" >&2
        exit 1
    fi
    if ! "$cmake" -S "$src/docs/tutorial" -B "$tmp/tut" -DCMAKE_PREFIX_PATH="$prefix" \
            -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="${ZD_DOCS_CFLAGS:-}" > "$tmp/tut.log" 2>&1 ||
       ! "$cmake" --build "$tmp/tut" >> "$tmp/tut.log" 2>&1; then
        cat "$tmp/tut.log"
        echo "FAIL: docs/tutorial/CMakeLists.txt does not build against the installed package" >&2
        exit 1
    fi
    # zdist.pc names the prefix configured, not the one installed to here:
    # --define-prefix takes it from the .pc file's place instead.
    pc=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --define-prefix --cflags --libs zdist) || {
        echo "FAIL: pkg-config finds no zdist in $prefix/lib/pkgconfig" >&2; exit 1; }
    read -r -a pc_flags <<< "$pc"
    if ! "$cc" "${extra_flags[@]}" -o "$tmp/add_pc" "$src/docs/tutorial/add.c" "${pc_flags[@]}"; then
        echo "FAIL: add.c does not build with pkg-config --cflags --libs zdist" >&2
        exit 1
    fi
    for prog in "$tmp/tut/add" "$tmp/add_pc"; do
        if ! LD_LIBRARY_PATH="$prefix/lib" timeout 120 "$launch" --nproc=2 --no_rank_flags \
                --timeout_s=100 -- "$prog" > "$tmp/again.out" 2>&1 ||
           ! grep -q '^\[rank 0\] add(2, 3) on worker1 = 5$' "$tmp/again.out"; then
            cat "$tmp/again.out"
            echo "FAIL: $prog (built against the installed package) did not print the sum" >&2
            exit 1
        fi
    done
    echo "docs tutorial: add and split ran; built with CMake and pkg-config against an install"
    exit 0
fi

# ---- the C blocks of README.md and docs/*.md ----

if [ -f "$src/include/zdist/zdist.h" ]; then
    headers="#include <zdist/zdist.h>"
else
    headers=$(cd "$src/include" && for h in zdist/*.h; do echo "#include <$h>"; done)
fi
prelude="#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
$headers"

# Split each page into blocks: $tmp/bN.body (the block's text) and
# $tmp/bN.meta (page, line of the first body line, info words, context).
n=0
for md in "$src"/README.md "$src"/docs/*.md; do
    rel=${md#"$src/"}
    awk -v rel="$rel" -v dir="$tmp" -v start="$n" '
        function flush_meta() {
            printf "%s\t%d\t%s\t%s\n", rel, body_line, info, ctx > (dir "/b" k ".meta")
            close(dir "/b" k ".meta")
        }
        BEGIN { k = start; inblock = 0; prev = "" }
        {
            if (!inblock && $0 ~ /^```/) {
                inblock = 1
                lang = substr($0, 4)
                if (lang ~ /^c([ \t]|$)/) {
                    isc = 1
                    info = substr(lang, 2); gsub(/^[ \t]+|[ \t]+$/, "", info)
                    ctx = ""
                    if (prev ~ /^<!-- context:.*-->[ \t]*$/) {
                        ctx = prev
                        sub(/^<!-- context:[ \t]*/, "", ctx); sub(/[ \t]*-->[ \t]*$/, "", ctx)
                    }
                    body_line = NR + 1
                    printf "" > (dir "/b" k ".body")
                } else
                    isc = 0
            } else if (inblock && $0 ~ /^```[ \t]*$/) {
                inblock = 0
                if (isc) { close(dir "/b" k ".body"); flush_meta(); k++ }
            } else if (inblock && isc)
                print > (dir "/b" k ".body")
            prev = $0
        }
        END {
            if (inblock) { printf "%s: unterminated code block\n", rel > "/dev/stderr"; exit 1 }
            print k > (dir "/count")
        }' "$md" || exit 1
    n=$(cat "$tmp/count")
done

fail=0
programs=0
fragments=0
decls=0
for ((k = 0; k < n; k++)); do
    IFS=$'\t' read -r page line info ctx < "$tmp/b$k.meta"
    body="$tmp/b$k.body"
    where="$page:$line"
    kind=""
    file=""
    for w in $info; do
        case $w in
            program|fragment|decl) kind=$w ;;
            nocompile) echo "FAIL: $where: \`\`\`c nocompile is not allowed: every block compiles" >&2
                       fail=1; continue 2 ;;
            file=*) file=${w#file=} ;;
            *) echo "FAIL: $where: unknown marker \"$w\" (program, decl, fragment, file=PATH)" >&2
               fail=1; continue 2 ;;
        esac
    done
    if [ -z "$kind" ]; then
        if grep -q 'int main(' "$body"; then kind=program; else kind=fragment; fi
    fi
    if [ -n "$file" ]; then
        echo "$file" >> "$tmp/shown"
        if [ "$kind" != program ]; then
            echo "FAIL: $where: file= goes with program blocks" >&2
            fail=1
            continue
        fi
        if ! cmp -s "$body" "$src/docs/$file"; then
            echo "FAIL: $where: the block differs from docs/$file:" >&2
            diff "$body" "$src/docs/$file" | head -20 >&2
            fail=1
        fi
    fi
    c="$tmp/b$k.c"
    case $kind in
        program)
            programs=$((programs + 1))
            { echo "#line $line \"$page\""; cat "$body"; } > "$c"
            if ! "$cc" "${cflags[@]}" -o "$tmp/b$k" "$c" "$lib" "${libs[@]}"; then
                echo "FAIL: $where: program does not build" >&2
                fail=1
            fi
            continue ;;
        decl)
            decls=$((decls + 1))
            { echo "$prelude"; echo "$ctx"; echo "#line $line \"$page\""; cat "$body"; } > "$c" ;;
        fragment)
            fragments=$((fragments + 1))
            { echo "$prelude"; echo "$ctx"; echo "int zd_docs_fragment_$k(void);"
              echo "int zd_docs_fragment_$k(void)"; echo "{"
              echo "#line $line \"$page\""; cat "$body"; echo "return 0;"; echo "}"; } > "$c" ;;
    esac
    if ! "$cc" "${cflags[@]}" -Wno-unused-variable -Wno-unused-but-set-variable \
            -Wno-unused-function -c -o "$tmp/b$k.o" "$c"; then
        echo "FAIL: $where: $kind does not compile" >&2
        fail=1
    fi
done

# Every program of docs/tutorial/ is shown whole on a page.
for f in "$src"/docs/tutorial/*.c; do
    [ -e "$f" ] || continue
    if ! grep -qxF "tutorial/${f##*/}" "$tmp/shown" 2>/dev/null; then
        echo "FAIL: docs/tutorial/${f##*/} is shown by no \`\`\`c program file=tutorial/${f##*/} block" >&2
        fail=1
    fi
done

# The pages name only what the public headers declare, and no SPEC ids.
declared=$(cat "$src"/include/zdist/*.h)
for md in "$src"/README.md "$src"/docs/*.md; do
    rel=${md#"$src/"}
    for name in $(grep -oE '\b(zd|ZD)_[A-Za-z0-9_]+' "$md" | grep -vE '^(zd|ZD)__' | sort -u); do
        if ! grep -qw -- "$name" <<< "$declared"; then
            echo "FAIL: $rel names $name, which no public header declares" >&2
            fail=1
        fi
    done
    if grep -nw SPEC "$md" >&2; then
        echo "FAIL: $rel cites the SPEC (a user has none)" >&2
        fail=1
    fi
done

echo "check_docs: $n blocks ($programs programs, $decls decls, $fragments fragments) in $(ls "$src"/README.md "$src"/docs/*.md | wc -l) pages"
[ $fail = 0 ] && echo "check_docs: all passed"
exit $fail
