#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Every C source and header is laid out as .clang-format says, so a diff
# shows what changed and never how someone's editor indents. docs/ is
# left out: check_docs compares its programs byte for byte with the
# documents that quote them.
#   usage: tests/check_format.sh SOURCE_DIR
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
cf=$(command -v clang-format || true)
if [ -z "$cf" ]; then
  echo "check_format: clang-format not found (tools/install_deps.sh installs it)" >&2
  exit 1
fi
mapfile -t files < <(find . \( -path ./docs -o -path './build*' -o -path './.git' \) -prune \
                          -o -name '*.[ch]' -print | sort)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
if ! "$cf" --dry-run --Werror "${files[@]}" 2>"$out"; then
  grep -E '^[^ ].*: (error|warning):' "$out" | sed 's/:[0-9]*:[0-9]*: error: code should be clang-formatted.*//' \
    | sort -u | head -20 >&2
  echo "check_format: the files above differ from .clang-format's layout (fix: clang-format -i FILE)" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files laid out as .clang-format says"
