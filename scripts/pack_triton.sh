#!/usr/bin/env bash
# triton 3.7.1 for the offline GPU machine (Python 3.12, x86-64, whose image has triton 3.6.0): the
# wheel (189 MB) unpacked, without what a kernel run does not load (CUPTI and its static libraries,
# the Blackwell ptxas, the proton profiler), xz-compressed and split into .triton/part1 and part2 of
# at most 49 MiB each (a device call carries 64 MiB with the tracked tree). Install on the GPU
# machine with scripts/install_triton.sh in two back-to-back calls:
#   call 1, carry [".triton/part1"]:  bash scripts/install_triton.sh 1
#   call 2, carry [".triton/part2"]:  . scripts/install_triton.sh 2 && python3 scripts/probe_multicast.py
# Usage: scripts/pack_triton.sh [python]   (needs pip and network access; .triton/ is ignored by git)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python3}
VERSION=3.7.1
OUT=.triton
rm -rf "$OUT" && mkdir -p "$OUT/wheel" "$OUT/tree" "$OUT/part1" "$OUT/part2"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d "$OUT/wheel" "triton==$VERSION"
"$PY" -m zipfile -e "$OUT"/wheel/triton-*.whl "$OUT/tree"
rm -rf "$OUT/tree/triton/backends/nvidia/lib/cupti" "$OUT/tree/triton/backends/nvidia/bin/ptxas-blackwell" \
       "$OUT/tree/triton/_C/libproton.so"
chmod +x "$OUT"/tree/triton/backends/nvidia/bin/*  # zipfile drops the mode bits
tar cf - -C "$OUT/tree" . | xz -T0 -6 > "$OUT/triton.tar.xz"
sha256sum "$OUT/triton.tar.xz" | cut -d' ' -f1 > "$OUT/part2/triton.tar.xz.sha256"
split -b 49M -d -a 1 "$OUT/triton.tar.xz" "$OUT/triton.tar.xz.part"
mv "$OUT/triton.tar.xz.part0" "$OUT/part1/" && mv "$OUT/triton.tar.xz.part1" "$OUT/part2/"
[ ! -e "$OUT/triton.tar.xz.part2" ] || { echo "more than two parts: raise the part size" >&2; exit 1; }
rm -rf "$OUT/wheel" "$OUT/tree" "$OUT/triton.tar.xz"
du -sh "$OUT"/part1 "$OUT"/part2
