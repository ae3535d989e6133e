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
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check -c "$repo/constraints.txt" build
"$tmp/venv/bin/python" -m build -q --wheel --outdir "$tmp/dist" "$tmp/src" > /dev/null
wheel=$(ls "$tmp"/dist/treecoll-*.whl)
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check -c "$repo/constraints.txt" "$wheel"
# every installed distribution is the version constraints.txt pins (torch: its CPU build, no CUDA libraries)
"$tmp/venv/bin/python" - "$repo/constraints.txt" <<'EOF_PY'
import re
import sys
from importlib.metadata import distributions


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


pins = {}
for line in open(sys.argv[1], encoding="utf-8"):
    name, _, version = line.split("#")[0].strip().partition("==")
    if name:
        pins[norm(name)] = version
installed = {norm(d.metadata["Name"]): d.version for d in distributions()}
off_pin = sorted(f"{n}=={v}" for n, v in installed.items()
                 if n not in {"pip", "setuptools", "treecoll"} and v.split("+")[0] != pins.get(n))
cuda = sorted(n for n in installed if re.fullmatch(r"nvidia-.*-cu\d+", n) or "+cu" in installed[n])
if off_pin or cuda or "torch" not in installed:
    sys.exit(f"wheel install: expected torch's CPU build and every distribution at its constraints.txt pin, "
             f"got torch {installed.get('torch', 'missing')}, off the pins {off_pin}, CUDA {cuda}; "
             f"pin them in constraints.txt")
print(f"wheel install: {len(installed)} distributions at their pinned versions, torch {installed['torch']}")
EOF_PY
# only treecoll is installed at the top level: no generic names (topo, tools, ...)
top=$(unzip -Z1 "$wheel" | cut -d/ -f1 | sort -u | grep -v '\.dist-info$')
[ "$top" = "treecoll" ] || { echo "wheel installs top-level names other than treecoll: $top"; exit 1; }
cd "$tmp"
"$tmp/venv/bin/python" -c "import treecoll; print('import treecoll', treecoll.__version__)"
"$tmp/venv/bin/treecoll" topo show dgx-h100-x16 | head -3
"$tmp/venv/bin/treecoll" simulate allreduce --topology default --sizes 64K,1M | tail -2
echo "wheel check passed: $(basename "$wheel")"
