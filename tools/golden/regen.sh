#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# regen.sh [OUTDIR] [gen_golden.py options]: makes the golden reference tensors
# again with PyTorch (tools/golden/gen_golden.py): OUTDIR/golden/<case>/ and
# OUTDIR/golden-toolkit/<case>/, the same folders, manifests, names and shapes
# as the committed sets, new values from fixed seeds; two runs write the same
# bytes. OUTDIR defaults to this repository's tests/ folder, i.e. over the
# committed sets; give another folder to look before replacing them.
#
# Needs Debian's python3-torch (PyTorch 1.13.1; nothing from pip) and, for
# the images of the net and convnet cases, Debian's dataset-fashion-mnist:
#   apt-get install -y --no-install-recommends python3-torch dataset-fashion-mnist
# (or pass --synthetic-images, or --fashion-mnist DIR). It runs Debian's
# /usr/bin/python3 (set PYTHON to use another interpreter that has torch).
#
# To run the tests on a folder made elsewhere, configure with
#   cmake -S . -B build -DZDIST_GOLDEN_DIR=OUTDIR/golden \
#         -DZDIST_GOLDEN_TOOLKIT_DIR=OUTDIR/golden-toolkit
# ctest gives each test the environment variables ZDIST_GOLDEN_DIR and
# ZDIST_GOLDEN_TOOLKIT_DIR from those two cache variables (so exporting them
# around ctest has no effect); a test program run by hand reads them.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tests=$(cd "$here/../../tests" && pwd)
out=$tests
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  out=$1
  shift
fi
python=${PYTHON:-/usr/bin/python3}
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "regen.sh: $python has no torch: apt-get install -y --no-install-recommends python3-torch" >&2
  exit 1
fi
mkdir -p "$out"
"$python" "$here/gen_golden.py" "$out" "$@"
# A folder outside the repository gets the READMEs too: they describe the
# format, and golden_check reads its tolerances from them.
for set in golden golden-toolkit; do
  if [ ! -e "$out/$set/README.md" ]; then
    cp "$tests/$set/README.md" "$out/$set/README.md"
    chmod u+w "$out/$set/README.md"
  fi
done
echo "regen.sh: wrote $out/golden and $out/golden-toolkit"
