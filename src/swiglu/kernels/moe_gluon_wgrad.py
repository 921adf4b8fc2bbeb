"""The pieces the MoE experts' Gluon weight-gradient kernels share (sm_90): their walk over all
experts' tiles and the test of what they take.

    c[e] = a_e^T @ b_e  for every expert e,  a [S, M] and b [S, N] bf16 in expert order (rows
    expert_start[e] .. expert_start[e + 1]), c [E, M, N] bf16, fp32 accumulation,

the library's ``moe_wgrad_kernel`` contract (``swiglu.kernels.moe.launch_wgrad``). The persistent
programs walk (expert, M tile, N tile) in expert order (``_tile_mn``'s bands within an expert);
an expert's K range is read from ``expert_start``. The kernel the plan runs is
``moe_gluon_wgrad_pingpong``'s; the cooperative one these pieces were written for (both MMA
warpgroups on one tile) is the lab's ``swiglu_lab.experiments.moe_gluon_wgrad_cooperative``.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .configs import GluonConfig
from .tl_kernels import _tile_mn  # scalar integer code only: compiles the same in a Gluon kernel


@gluon.constexpr_function
def _smem_layout(block):
    return gl.NVMMASharedLayout.get_default_for(list(block), gl.bfloat16)


@gluon.jit
def _program_tiles(E, M, N, BM: gl.constexpr, BN: gl.constexpr):
    """(num_m, num_n, pid, nprog, num_tiles): an expert's BM x BN tiles and this persistent
    program's share of all experts' (tiles pid, pid + nprog, ...), as every partition counts."""
    num_m = gl.cdiv(M, BM)
    num_n = gl.cdiv(N, BN)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    return num_m, num_n, pid, nprog, gl.cdiv(E * num_m * num_n - pid, nprog)


@gluon.jit
def _tile_of(tile, num_m, num_n, GROUP_M: gl.constexpr):
    """(e, pid_m, pid_n): the expert of ``tile`` and its tile indices within the expert."""
    per_e = num_m * num_n
    pid_m, pid_n = _tile_mn(tile % per_e, num_m, num_n, GROUP_M)
    return tile // per_e, pid_m, pid_n


@gluon.jit
def _expert_tile(tile, num_m, num_n, start_ptr, GROUP_M: gl.constexpr):
    """(e, pid_m, pid_n, lo, rows): ``_tile_of``'s and the expert's first row and row count."""
    e, pid_m, pid_n = _tile_of(tile, num_m, num_n, GROUP_M)
    lo = gl.load(start_ptr + e)
    rows = gl.load(start_ptr + e + 1) - lo
    return e, pid_m, pid_n, lo, rows


def supports(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, cfg: GluonConfig) -> bool:
    """Whether a weight-gradient kernel of tile ``cfg`` takes these operands: contiguous bf16 CUDA tensors
    (the caller checks that Gluon runs on the device), 16-byte aligned (TMA), a and b with the same
    rows, at least one (no rows: the tl kernel writes the zeros; not run on a GPU here), M, N > 0,
    M % BM == 0 (an output box inside one expert) and M, N multiples of 8 (TMA's 16-byte row
    strides; the lab kernel's descriptors start at row expert_start[e])."""
    M, N = c.shape[1], c.shape[2]
    return (
        all(t.is_cuda and t.dtype == torch.bfloat16 and t.is_contiguous() and t.data_ptr() % 16 == 0 for t in (a, b, c))
        and a.shape[0] == b.shape[0] > 0
        and M > 0
        and N > 0
        and M % cfg.BM == 0
        and M % 8 == 0
        and N % 8 == 0
    )
