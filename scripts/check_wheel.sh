#!/usr/bin/env bash
# The lean install, checked (CI runs it after `make test`): build the wheel, check that it holds the
# library only (swiglu/..., no lab file) and that its only required dependencies are torch and
# triton, install it without extras into a fresh venv that holds nothing but the dependency closure
# of torch and triton, and run scripts/wheel_smoke.py there.
#
# The closure is linked in from the project venv, not downloaded (a CPU torch is ~200 MB): the
# distributions that torch's and triton's metadata require, recursively, and nothing else (pip check
# confirms every requirement is met). So pandas, matplotlib, tqdm, NVML, papermill, numpy and
# transformers are absent, and an import of any of them by the library fails the smoke test.
# Usage: scripts/check_wheel.sh [python]   (default .venv/bin/python); scratch under build/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
OUT=build/wheel-check
rm -rf "$OUT" && mkdir -p "$OUT"
# No build isolation: setuptools comes from the project venv (nothing downloaded).
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT/dist" .
WHEEL=$(ls "$OUT"/dist/swiglu-*.whl)
"$PY" - "$WHEEL" "$OUT/venv" <<'PYEOF'
import importlib.metadata as md
import os
import re
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

try:
    from packaging.requirements import Requirement
except ImportError:  # pip's own copy
    from pip._vendor.packaging.requirements import Requirement

wheel, target = sys.argv[1], Path(sys.argv[2])
with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
    meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
# The library alone: swiglu/... and the wheel's own metadata, no lab file (lab/, swiglu_lab).
foreign = [n for n in names if not (n.startswith("swiglu/") or re.match(r"swiglu-[^/]+\.dist-info/", n))]
assert not foreign, f"the wheel holds files outside swiglu/: {foreign[:10]}"
assert not [n for n in names if "swiglu_lab" in n or n.startswith(("swiglu/bench/", "swiglu/research/"))], names
assert "swiglu/kernels/backward_configs.json" in names, "the kernels' config table is missing from the wheel"
print(f"{Path(wheel).name}: {len(names)} files, all under swiglu/ (no lab file)")
requires = [Requirement(line.split(":", 1)[1].strip()) for line in meta.splitlines() if line.startswith("Requires-Dist:")]
required = sorted(r.name for r in requires if not (r.marker and "extra" in str(r.marker)))
assert required == ["torch", "triton"], f"the wheel requires {required}; the library's dependencies are torch and triton"
extras = sorted({m for r in requires if r.marker for m in re.findall(r'extra == "([^"]+)"', str(r.marker))})
print(f"{Path(wheel).name}: requires {required}; extras {extras}")

def canon(name):
    return re.sub(r"[-_.]+", "-", name).lower()

closure, todo = {}, ["torch", "triton"]
while todo:
    name = canon(todo.pop())
    if name in closure:
        continue
    dist = md.distribution(name)
    closure[name] = dist
    for spec in dist.requires or []:
        req = Requirement(spec)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            todo.append(req.name)
print("dependency closure linked in:", ", ".join(sorted(closure)))

venv.create(target, with_pip=False, symlinks=True)
py = target / "bin" / "python"
site = Path(subprocess.check_output([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
src_site = Path(sysconfig.get_paths()["purelib"])
for dist in closure.values():
    tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
    for top in tops:
        if top == "__pycache__":
            continue
        source = Path(dist.locate_file(top))
        if source.exists() and not (site / top).exists():
            os.symlink(source, site / top)
PYEOF
"$PY" -m pip --python "$OUT/venv/bin/python" install -q --no-deps --no-index "$WHEEL"
"$PY" -m pip --python "$OUT/venv/bin/python" check
# -I: ignore PYTHONPATH (src/) and the user site; run from build/ so the checkout is not on sys.path.
(cd "$OUT" && venv/bin/python -I ../../scripts/wheel_smoke.py)
