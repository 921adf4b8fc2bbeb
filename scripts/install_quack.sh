#!/usr/bin/env bash
# Install what scripts/pack_quack.sh packed, on the GPU machine, in two back-to-back calls:
#   bash scripts/install_quack.sh 1      (with .quack/part1 carried): stage part 1 in /tmp/quack-wheels
#   . scripts/install_quack.sh 2         (with .quack/part2 carried): join the split tar.xz, check its
#                                          sha256, install the wheels and unpack it into
#                                          /tmp/quack/site-packages, set PYTHONPATH
#                                          (sourced in the shell that runs the bench: not in a pipe or a
#                                          subshell, where the PYTHONPATH is lost; /tmp/quack/env.sh sets it again)
# A folder named site-packages on purpose (swiglu_lab.bench.quack_peer.check_install_location), and
# CuTe-DSL's dsl_packages on the path (its .pth file is read only in site directories).
STAGE=/tmp/quack-wheels
SITE=/tmp/quack/site-packages
case "${1:-}" in
  1)
    mkdir -p "$STAGE" && cp .quack/part1/* "$STAGE"/ && ls "$STAGE" ;;
  2)
    cp .quack/part2/* "$STAGE"/ || return 1 2>/dev/null || exit 1
    for p2 in "$STAGE"/*.tar.xz.part2; do
      xz=${p2%.part2}
      [ -f "$xz.part1" ] || { echo "part 1 of $(basename "$xz") missing: run 'install_quack.sh 1' first, on the same warm machine" >&2; return 1 2>/dev/null || exit 1; }
      cat "$xz.part1" "$p2" > "$xz" && rm "$xz.part1" "$p2"
      [ "$(sha256sum "$xz" | cut -d' ' -f1)" = "$(cat "$xz.sha256")" ] || { echo "$(basename "$xz"): checksum mismatch" >&2; return 1 2>/dev/null || exit 1; }
    done
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$STAGE"/*.whl || { return 1 2>/dev/null || exit 1; }
    # The largest wheel's files, recompressed by pack_quack.sh: what pip would unpack into the target.
    for xz in "$STAGE"/*.tar.xz; do tar -C "$SITE" -xJf "$xz" || { return 1 2>/dev/null || exit 1; }; done
    export PYTHONPATH="$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}"
    echo "export PYTHONPATH=\"$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages\${PYTHONPATH:+:\$PYTHONPATH}\"" > /tmp/quack/env.sh
    echo "quack installed in $SITE; PYTHONPATH=$PYTHONPATH" ;;
  *)
    echo "usage: bash scripts/install_quack.sh 1   then   . scripts/install_quack.sh 2" >&2 ;;
esac
