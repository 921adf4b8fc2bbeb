"""The Gluon kernels' candidate configurations that the probes measure and the tests compile, and
that no table entry of the library names: the library's backward runs what backward_configs.json
holds (a table's ``"candidate"`` index, written by ``scripts/table_variant.py``, points into these
lists). Measurements: docs/kernels.md and the data READMEs.

- ``PINGPONG_CANDIDATES``, ``WIDE_CANDIDATES``: ``gluon_wgrad``'s ping-pong weight-gradient tiles
  (``lab/probes/probe_wgrad_defer.py``, ``scripts/table_variant.py --gluon-grad-weights``).
- ``GRAD_X_CANDIDATES``: ``gluon_wgrad_probe.launch_grad_x_gluon``'s tiles (``lab/probes/probe_gluon_grad_x.py``,
  ``scripts/table_variant.py --gluon-grad-x``).
- ``DSWIGLU_CANDIDATES``: ``gluon_dswiglu``'s (``lab/probes/probe_gluon_dswiglu.py --configs``,
  ``scripts/table_variant.py --gluon-dswiglu``).
"""

from __future__ import annotations

from swiglu.kernels.configs import DswigluGluonConfig, GluonConfig

# ----------------------------------------------------------------------------- gluon_wgrad: ping-pong
#: The ping-pong kernel's candidates (two MMA warpgroups on alternate tiles), compiled for sm_90 by
#: the CPU tests (192 bytes of epilogue spills at 168 registers) and checked bitwise against the
#: cooperative kernel on the GPU.
PINGPONG_CANDIDATES = (
    GluonConfig(BM=128, BN=128, BK=64, STAGES=4, NC=2, pingpong=True),
    GluonConfig(BM=128, BN=128, BK=32, STAGES=6, NC=2, pingpong=True),
)

#: quack's 128 x 192 ping-pong tiles (a 128 x 128 and a 128 x 64 chunk, ``GluonConfig.BN2``),
#: each MMA warpgroup at 232 registers for its 192 accumulator registers per thread, and the
#: 128 x 128 ping-pong tile at 232 (no spills); then quack's cooperative 256 x 192 tile (two
#: warpgroups on one tile, 192 accumulator registers each; the default partition gets 232 of the
#: 168 x 384 the workers leave: no spills), 9.1 bytes of operands from L2 per kFLOP against the
#: 128 x 256 tile's 11.7, measured 1.026x the tl kernel's time at T = 8192 and 1.002-1.011x in the
#: whole backward at 2984 / 8192: in no table (docs/kernels.md). Compiled for sm_90 by the CPU tests.
WIDE_CANDIDATES = (
    GluonConfig(BM=128, BN=128, BN2=64, BK=64, STAGES=4, NC=1, pingpong=True, mma_regs=232),
    GluonConfig(BM=128, BN=128, BN2=64, BK=64, STAGES=3, NC=2, pingpong=True, mma_regs=232),
    GluonConfig(BM=128, BN=128, BN2=64, BK=32, STAGES=6, NC=2, pingpong=True, mma_regs=232),
    GluonConfig(BM=128, BN=128, BK=64, STAGES=4, NC=2, pingpong=True, mma_regs=232),
    GluonConfig(BM=256, BN=128, BN2=64, BK=32, STAGES=4, NC=1, GROUP_M=16),
    GluonConfig(BM=256, BN=128, BN2=64, BK=32, STAGES=3, NC=1, GROUP_M=16),
)

# ----------------------------------------------------------------------------- gluon_wgrad_probe: grad_x
#: grad_x candidates (cooperative: at T <= 512 a program has about one tile, so a second MMA
#: warpgroup on other tiles would idle): the tl table's 128 x 256 and 64 x 256 tiles, 128 x 128,
#: and 128 x 256 in K-steps of 32; compiled for sm_90 by the CPU tests; on the H200 bitwise the tl
#: grad_x kernel and slower than it but at T = 1024 (data/tuning/gluon_grad_x_probe_96ffe16_20261202.csv).
GRAD_X_CANDIDATES = (
    GluonConfig(BM=128, BN=256, BK=64, STAGES=3, NC=1, GROUP_M=8),
    GluonConfig(BM=64, BN=256, BK=64, STAGES=4, NC=1, GROUP_M=8, num_warps=4),
    GluonConfig(BM=128, BN=128, BK=64, STAGES=4, NC=2, GROUP_M=8),
    GluonConfig(BM=128, BN=256, BK=32, STAGES=6, NC=1, GROUP_M=8),
)

# ----------------------------------------------------------------------------- gluon_dswiglu
#: Candidates (index = lab/probes/probe_gluon_dswiglu.py --configs and backward_configs.json's
#: ``"candidate"``; measured: docs/kernels.md). With 12 warps the launch holds 12 x 32 x 168 = 64512
#: registers; the 12-warp configs give the epilogue 168 (32x64 pieces spilled at 152). Entry 0 is
#: ``DswigluGluonConfig()``, ``gluon_dswiglu.launch_dswiglu_gluon``'s default.
DSWIGLU_CANDIDATES = [
    DswigluGluonConfig(),  # 0: 128x256x64 S3, g x1, 2 epilogue warps, pieces 16x64 (no spills)
    DswigluGluonConfig(EPI_M=32),  # 1: bigger pieces (fewer, longer epilogue steps; 24-60 B of spills)
    DswigluGluonConfig(BK=32, STAGES=6),  # 2: 128x256x32, 6 stages (smaller TMA steps, same smem)
    # 3: 128x128 tiles, 8 MMA warps (64 acc regs/thread), 4 epilogue warps, 2 g buffers, 4 stages
    DswigluGluonConfig(BN=128, STAGES=4, NG=2, EPI_M=32, epi_warps=4, maxnreg=128, epi_regs=128),
    # 4: 128x128 tiles on one MMA warpgroup (128 acc regs/thread), 4 epilogue warps
    DswigluGluonConfig(BN=128, STAGES=4, NG=2, EPI_M=32, num_warps=4, epi_warps=4, maxnreg=168, epi_regs=232),
]
# Tried and dropped: 128x256x32 with 2 g buffers and 3 or 4 stages (for short K): slower than #0
# or tied with it in every case measured (docs/kernels.md).
