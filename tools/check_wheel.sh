#!/usr/bin/env bash
# The distribution as users get it: a wheel built from the committed tree, installed into a
# fresh virtual environment (dependencies pinned by constraints.txt), run from an unrelated
# directory. Usage: bash tools/check_wheel.sh [PYTHON]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${1:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git -C "$repo" archive HEAD | tar -x -C "$tmp" --one-top-level=src
"$py" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check build
"$tmp/venv/bin/python" -m build -q --wheel --outdir "$tmp/dist" "$tmp/src" > /dev/null
wheel=$(ls "$tmp"/dist/treecoll-*.whl)
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check -c "$repo/constraints.txt" "$wheel"
# only treecoll is installed at the top level: no generic names (topo, tools, ...)
top=$(unzip -Z1 "$wheel" | cut -d/ -f1 | sort -u | grep -v '\.dist-info$')
[ "$top" = "treecoll" ] || { echo "wheel installs top-level names other than treecoll: $top"; exit 1; }
cd "$tmp"
"$tmp/venv/bin/python" -c "import treecoll; print('import treecoll', treecoll.__version__)"
"$tmp/venv/bin/treecoll" topo show dgx-h100-x16 | head -3
"$tmp/venv/bin/treecoll" simulate allreduce --topology default --sizes 64K,1M | tail -2
echo "wheel check passed: $(basename "$wheel")"
