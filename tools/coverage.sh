#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Line and branch coverage of the library (the folders libzdist is built
# from; not the tests, tools or examples) by the test suite.
#   tools/coverage.sh [--csv] [CTEST_ARGS...]     e.g. tools/coverage.sh -L quick
# Builds build-coverage (-DZDIST_COVERAGE=ON: gcov counters, -O0; with
# -DZDIST_FAULT_INJECT=ON, so that test_fault_alloc reaches the
# out-of-memory branches), runs the
# tests (all of them unless CTEST_ARGS select some), and prints each
# folder's figures and the library's with gcovr; --csv prints
# coverage_lines_pct and coverage_branches_pct as name,value,unit lines.
# The HTML report is build-coverage/coverage/index.html.
set -euo pipefail
cd "$(dirname "$0")/.."
csv=0
if [ "${1:-}" = "--csv" ]; then csv=1; shift; fi
command -v gcovr > /dev/null || { echo "coverage: gcovr is missing (tools/install_deps.sh)" >&2; exit 1; }
dir=build-coverage
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Debug -DZDIST_COVERAGE=ON -DZDIST_FAULT_INJECT=ON > /dev/null
cmake --build "$dir" -j "$(nproc)" > /dev/null
find "$dir" -name '*.gcda' -delete
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-2}
# A failing test still counts what it ran; the figures are what matters here.
(cd "$dir" && ctest -j "$(nproc)" "$@" > ctest-coverage.log 2>&1) ||
  echo "coverage: some tests failed (see $dir/ctest-coverage.log)" >&2
lib='(autograd|rpc|dist_autograd|dist_nn|dist_optim|nn|optim)/'
mkdir -p "$dir/coverage"
gcovr -r . --object-directory "$dir" --filter "$lib" --exclude-unreachable-branches \
  --exclude-throw-branches --gcov-ignore-parse-errors --html-details "$dir/coverage/index.html" \
  --json-summary "$dir/coverage/summary.json" --print-summary > "$dir/coverage/summary.txt"
python3 - "$dir/coverage/summary.json" "$csv" <<'PY'
import json, sys, collections
s = json.load(open(sys.argv[1]))
csv = sys.argv[2] == "1"
lines_pct = s["line_percent"]; branch_pct = s["branch_percent"]
if csv:
    print(f"coverage_lines_pct,{lines_pct:.1f},%")
    print(f"coverage_branches_pct,{branch_pct:.1f},%")
    sys.exit(0)
by = collections.defaultdict(lambda: [0, 0, 0, 0])
for f in s["files"]:
    d = f["filename"].split("/")[0]
    by[d][0] += f["line_covered"]; by[d][1] += f["line_total"]
    by[d][2] += f["branch_covered"]; by[d][3] += f["branch_total"]
print(f"{'folder':<16}{'lines':>16}{'branches':>18}")
for d, (lc, lt, bc, bt) in sorted(by.items()):
    print(f"{d:<16}{lc:>7}/{lt:<6}{100*lc/max(lt,1):5.1f}%{bc:>8}/{bt:<6}{100*bc/max(bt,1):5.1f}%")
print(f"{'library':<16}{s['line_covered']:>7}/{s['line_total']:<6}{lines_pct:5.1f}%"
      f"{s['branch_covered']:>8}/{s['branch_total']:<6}{branch_pct:5.1f}%")
PY
