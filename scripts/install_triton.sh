#!/usr/bin/env bash
# Install what scripts/pack_triton.sh packed, on the GPU machine, in two back-to-back calls:
#   bash scripts/install_triton.sh 1     (with .triton/part1 carried): stage part 1 in /tmp/triton-stage
#   . scripts/install_triton.sh 2        (with .triton/part2 carried): join, check the sha256, unpack into
#                                         /tmp/triton-3.7 and put it first on PYTHONPATH (sourced in the
#                                         shell that runs the probe; /tmp/triton-3.7/env.sh sets it again)
# The image's own triton 3.6.0 stays installed: the library's Gluon kernels are written for 3.6
# (common.GLUON_TRITON) and turn themselves off under 3.7; torch.compile is not checked with 3.7.
STAGE=/tmp/triton-stage
DEST=/tmp/triton-3.7
case "${1:-}" in
  1)
    mkdir -p "$STAGE" && cp .triton/part1/* "$STAGE"/ && ls -l "$STAGE" ;;
  2)
    cp .triton/part2/* "$STAGE"/ || return 1 2>/dev/null || exit 1
    [ -f "$STAGE/triton.tar.xz.part0" ] || { echo "part 1 missing: run 'install_triton.sh 1' first, on the same warm machine" >&2; return 1 2>/dev/null || exit 1; }
    cat "$STAGE/triton.tar.xz.part0" "$STAGE/triton.tar.xz.part1" > "$STAGE/triton.tar.xz"
    [ "$(sha256sum "$STAGE/triton.tar.xz" | cut -d' ' -f1)" = "$(cat "$STAGE/triton.tar.xz.sha256")" ] || { echo "triton.tar.xz: checksum mismatch" >&2; return 1 2>/dev/null || exit 1; }
    mkdir -p "$DEST" && xz -dc "$STAGE/triton.tar.xz" | tar xf - -C "$DEST" || { return 1 2>/dev/null || exit 1; }
    export PYTHONPATH="$DEST${PYTHONPATH:+:$PYTHONPATH}"
    echo "export PYTHONPATH=\"$DEST\${PYTHONPATH:+:\$PYTHONPATH}\"" > "$DEST/env.sh"
    echo "triton $(python3 -c 'import triton; print(triton.__version__)') in $DEST; PYTHONPATH=$PYTHONPATH" ;;
  *)
    echo "usage: bash scripts/install_triton.sh 1   then   . scripts/install_triton.sh 2" >&2 ;;
esac
