#!/usr/bin/env bash
# triton 3.7.1 for the offline GPU machine (Python 3.12, x86-64, whose image has triton 3.6.0), small
# enough to travel with one device call (64 MiB with the tracked tree): the wheel (189 MB) unpacked,
# libtriton.so stripped of its debug information (441 -> 172 MiB), without what a kernel run on
# NVIDIA does not load (the AMD backend and its entry point, CUPTI and its static libraries, the
# Blackwell ptxas, the proton profiler, the instrumentation plugins), xz -9: one file of about 48 MiB,
# .triton/triton.tar.xz. Install on the GPU machine in the same call that uses it:
#   carry [".triton"]:  . scripts/install_triton.sh && PYTHONPATH=src:lab:$PYTHONPATH python3 lab/probes/probe_multicast_wgrad.py
# Usage: scripts/pack_triton.sh [python]   (needs pip, binutils' strip and network access; .triton/ is
# ignored by git)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python3}
VERSION=3.7.1
OUT=.triton
LIMIT_MIB=52  # what the tracked tree (about 11 MiB) leaves of a call's 64 MiB
rm -rf "$OUT" && mkdir -p "$OUT/wheel" "$OUT/tree"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d "$OUT/wheel" "triton==$VERSION"
"$PY" -m zipfile -e "$OUT"/wheel/triton-*.whl "$OUT/tree"
T="$OUT/tree/triton"
rm -rf "$T/backends/amd" "$T/backends/nvidia/lib/cupti" "$T/backends/nvidia/bin/ptxas-blackwell" \
       "$T/_C/libproton.so" "$T/instrumentation"
sed -i '/^amd = /d' "$OUT"/tree/triton-*.dist-info/entry_points.txt  # triton imports every listed backend
strip --strip-unneeded "$T/_C/libtriton.so"
chmod +x "$T"/backends/nvidia/bin/*  # zipfile drops the mode bits
tar cf - -C "$OUT/tree" . | xz -T0 -9 > "$OUT/triton.tar.xz"
sha256sum "$OUT/triton.tar.xz" | cut -d' ' -f1 > "$OUT/triton.tar.xz.sha256"
rm -rf "$OUT/wheel" "$OUT/tree"
size=$(stat -c %s "$OUT/triton.tar.xz")
[ "$size" -le $((LIMIT_MIB << 20)) ] || { echo "triton.tar.xz is $((size >> 20)) MiB, over $LIMIT_MIB" >&2; exit 1; }
du -sh "$OUT"
