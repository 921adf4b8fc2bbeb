#!/usr/bin/env bash
# quack-kernels and its CuTe-DSL stack (the pins of the lab's [quack] extra, lab/pyproject.toml), packed
# for the offline GPU machine (Python 3.12, x86-64) into .quack/ in two parts of equal size: the device
# tool carries 64 MiB per call (the tracked tree, ~12 MiB, included) and the wheels are ~105 MiB, of
# which nvidia-cutlass-dsl-libs-cu13 is ~84. That wheel's files travel as one tar.xz (~61 MiB: xz
# packs its shared libraries a third smaller than the wheel's zip), split across the parts. Install on the GPU machine with scripts/install_quack.sh in
# two back-to-back calls (the staging folder in /tmp survives while the machine stays warm):
#   call 1, carry [".quack/part1"]:  bash scripts/install_quack.sh 1
#   call 2, carry [".quack/part2"]:  . scripts/install_quack.sh 2 && python3 -m swiglu_lab.bench --impls quack,...
# Usage: scripts/pack_quack.sh [python]   (needs pip and network access; .quack/ is ignored by git)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python3}
OUT=.quack
rm -rf "$OUT" && mkdir -p "$OUT/wheels" "$OUT/part1" "$OUT/part2"
mapfile -t PINS < <("$PY" - <<'PYEOF'
import tomllib
with open("lab/pyproject.toml", "rb") as f:
    extra = tomllib.load(f)["project"]["optional-dependencies"]["quack"]
# "name[extra]==version" -> "name==version": --no-deps downloads exactly the pinned set.
for pin in extra:
    name, _, version = pin.partition("==")
    print(f"{name.split('[')[0]}=={version}")
PYEOF
)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$OUT/wheels" "${PINS[@]}"
[ "$(ls "$OUT"/wheels/*.whl | wc -l)" -eq "${#PINS[@]}" ] || { echo "expected ${#PINS[@]} wheels" >&2; exit 1; }
BIG=$(ls -S "$OUT"/wheels/*.whl | head -1)
for w in "$OUT"/wheels/*.whl; do [ "$w" = "$BIG" ] || mv "$w" "$OUT/part1/"; done
NAME=$(basename "$BIG" .whl)
mkdir "$OUT/big" && (cd "$OUT/big" && unzip -q "../wheels/$NAME.whl")
tar -C "$OUT/big" -cf - . | xz -T0 -6 > "$OUT/wheels/$NAME.tar.xz"
SMALL=$(du -cb "$OUT"/part1/* | tail -1 | cut -f1)
XZ=$(stat -c %s "$OUT/wheels/$NAME.tar.xz")
FIRST=$(((SMALL + XZ) / 2 - SMALL))
[ "$FIRST" -gt 0 ] || { echo "the small wheels alone exceed half of the whole" >&2; exit 1; }
head -c "$FIRST" "$OUT/wheels/$NAME.tar.xz" > "$OUT/part1/$NAME.tar.xz.part1"
tail -c +"$((FIRST + 1))" "$OUT/wheels/$NAME.tar.xz" > "$OUT/part2/$NAME.tar.xz.part2"
sha256sum "$OUT/wheels/$NAME.tar.xz" | cut -d' ' -f1 > "$OUT/part2/$NAME.tar.xz.sha256"
rm -rf "$OUT/wheels" "$OUT/big"
du -sh "$OUT"/part1 "$OUT"/part2
