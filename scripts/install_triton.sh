#!/usr/bin/env bash
# Install what scripts/pack_triton.sh packed (.triton, carried with the call) on the GPU machine:
#   . scripts/install_triton.sh     check the sha256, unpack into /tmp/triton-3.7 and put it first on
#                                   PYTHONPATH (sourced in the shell that runs the kernels;
#                                   /tmp/triton-3.7/env.sh sets it again)
# The image's own triton 3.6.0 stays installed beside it; the library's kernels run under either
# (devices.GLUON_TRITONS); torch.compile is not checked with 3.7.
DEST=/tmp/triton-3.7
ARCHIVE=.triton/triton.tar.xz
[ -f "$ARCHIVE" ] || { echo "$ARCHIVE missing: run scripts/pack_triton.sh here and carry .triton" >&2; return 1 2>/dev/null || exit 1; }
[ "$(sha256sum "$ARCHIVE" | cut -d' ' -f1)" = "$(cat "$ARCHIVE.sha256")" ] || { echo "$ARCHIVE: checksum mismatch" >&2; return 1 2>/dev/null || exit 1; }
mkdir -p "$DEST" && xz -dc "$ARCHIVE" | tar xf - -C "$DEST" || { return 1 2>/dev/null || exit 1; }
export PYTHONPATH="$DEST${PYTHONPATH:+:$PYTHONPATH}"
echo "export PYTHONPATH=\"$DEST\${PYTHONPATH:+:\$PYTHONPATH}\"" > "$DEST/env.sh"
echo "triton $(python3 -c 'import triton; print(triton.__version__)') in $DEST; PYTHONPATH=$PYTHONPATH"
