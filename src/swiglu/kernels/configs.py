"""The kernels' configurations: the dataclasses, the token buckets and the backward's one table,
``backward_configs.json`` (the measured choice per kernel and bucket, with its time, and for the
Gluon dSwiGLU kernel per (hidden_size, intermediate_size) where that shape measured another; written by
scripts/tune_kernels.py and the Gluon probes, read here once at import). Data only: the launchers
(``backward``, ``forward``) and the device checks (``devices``) import it, it imports none of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .shared_memory import estimate_shared_memory


@dataclass(frozen=True)
class KernelConfig:
    """Tile shape and launch parameters of one kernel launch."""

    BM: int = 128
    BN: int = 256
    BK: int = 64
    GROUP_M: int = 8
    EPI_SPLIT: int = 1
    num_stages: int = 3
    num_warps: int = 8
    warp_specialize: bool = False
    flatten: bool = False
    # False: one program per tile (several resident per SM, so one's stores could overlap
    # another's loads); True: one program per SM. The sweeps in data/tuning/: persistent won everywhere.
    persistent: bool = True
    # Weight-gradient kernel only: False stores C with plain (non-TMA) stores (never won either).
    tma_store: bool = True
    # grad_x kernel only: the tiles of a last partial wave split over K among the programs
    # (``tl_kernels.grad_x_split_tail_kernel``) where that wave would leave at least half the SMs idle.
    split_tail: bool = False

    def __post_init__(self) -> None:
        def pow2(v: int) -> bool:
            return v > 0 and v & (v - 1) == 0

        for name in ("BM", "BN", "BK"):
            v = getattr(self, name)
            if not pow2(v) or not 16 <= v <= 256:
                raise ValueError(f"KernelConfig.{name} must be a power of two in [16, 256] (tl.dot, TMA box), got {v}")
        if self.GROUP_M < 1:
            raise ValueError(f"KernelConfig.GROUP_M must be >= 1, got {self.GROUP_M}")
        if self.EPI_SPLIT not in (1, 2, 4) or self.BN // self.EPI_SPLIT < 8:
            raise ValueError(
                f"KernelConfig.EPI_SPLIT must be 1, 2 or 4 with BN // EPI_SPLIT >= 8, got {self.EPI_SPLIT} for BN={self.BN}"
            )
        if self.num_stages < 1 or self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(
                f"KernelConfig needs num_stages >= 1 and num_warps in 1..16 (a power of two), got "
                f"{self.num_stages} and {self.num_warps}"
            )


@dataclass(frozen=True)
class MoEGluonConfig:
    """Tile and launch parameters of the warp-specialized grouped MoE kernels (``moe_gluon_up``,
    ``moe_gluon_dswiglu``, the lab's pairs kernel): BM x BN tiles (the up projection's BN gate and
    BN up columns), STAGES k-steps of BK in flight, the epilogue EPI_M rows at a time in epi_warps
    warps; registers per thread: maxnreg (the MMA warps), load_regs, epi_regs (setmaxnreg)."""

    BM: int = 128
    BN: int = 128
    BK: int = 64
    STAGES: int = 3
    EPI_M: int = 16
    GROUP_M: int = 1  # 1: N tiles fastest (the MoE plan's order at I < 8192)
    num_warps: int = 8
    epi_warps: int = 2
    maxnreg: int = 168
    load_regs: int = 24
    epi_regs: int = 168


@dataclass(frozen=True)
class GluonConfig:
    """Tile shape and launch parameters of the Gluon weight-gradient kernel (``gluon_wgrad``)."""

    BM: int = 128
    BN: int = 256
    BK: int = 64
    STAGES: int = 3
    NC: int = 1  # output smem buffers: TMA stores in flight
    GROUP_M: int = 32
    num_warps: int = 8
    maxnreg: int = 168  # a WS kernel otherwise assumes 256 registers for every warp (08-warp-specialization.py)
    load_regs: int = 40
    store_regs: int = 40
    # Each tile's bf16 output stored to shared memory only after the next tile's first wgmma is
    # issued, so the tensor cores work through the epilogue (bitwise the same output; ``lab_only``).
    defer: bool = False
    # Two 4-warp MMA warpgroups on alternate tiles (``gluon_wgrad.wgrad_kernel`` with PINGPONG;
    # num_warps and defer then unused), each tile BM x BN: the table's choice at T = 129-2048, with
    # ``wg_store``; without it (the storer warp stores the tiles) ``lab_only``.
    pingpong: bool = False
    # A second output chunk BN2 columns wide beside the BN one (its own operand and output
    # buffers, a second accumulator), so a tile is BM x (BN + BN2) (Triton blocks are powers of
    # two): quack's 128 x 192 with pingpong, its cooperative 256 x 192 without (``lab_only``; not deferred,
    # TMA stores); 0: none.
    BN2: int = 0
    # Ping-pong only: setmaxnreg of the second MMA warpgroup (the first, the default partition,
    # gets what the workers leave: Triton's AllocateWarpGroups); 0: maxnreg. ptxas allocates a
    # worker's code under its setmaxnreg, above the launch's maxnreg (a 128 x 192 fp32
    # accumulator compiles without spills at 232 in a 168-register launch).
    mma_regs: int = 0
    # Cooperative only: each program keeps A's [K, BM] column block resident in shared memory
    # (the lab's ``swiglu_lab.experiments.gluon_wgrad_resident``, run once imported) for
    # K <= resident_k tokens, loaded once per run of tiles on the same rows, and streams only B: L2-to-SM reads K/BM per output element instead of
    # K (BM + BN) / (BM BN); GROUP_M programs then take each run of tiles in turn (1-64). 0: the
    # ring of A and B stages (``gluon_wgrad``).
    resident_k: int = 0
    # Cooperative only, not deferred: each tile stored with st.global instead of TMA stores (the
    # lab's ``swiglu_lab.experiments.gluon_wgrad_probe``, run once imported: its kernel's
    # PLAIN_STORE): 1 by the MMA warps (through a layout conversion in shared memory; the output
    # buffers go unused, NC = 1), 2 by the storer warp from its buffer; 0 TMA stores.
    plain_store: int = 0
    # Ping-pong with BN = 2 * BN2 only: each MMA warpgroup stores its own tile by TMA in three
    # BN2-wide chunks through wg_store chunk buffers of its own (quack's epilogue), no storer warp
    # and no whole-tile output buffer (NC unused); 0: the storer and NC tile buffers.
    wg_store: int = 0

    @property
    def tile_n(self) -> int:
        """A tile's columns: BN + BN2."""
        return self.BN + self.BN2

    @property
    def lab_only(self) -> bool:
        """Whether only the lab's copy of the kernel runs this config (``swiglu_lab.experiments.gluon_wgrad_probe``,
        once imported): st.global stores, a ring (no ``resident_k``) cooperative tile deferred or wide,
        or a ping-pong tile without a second column chunk (no ``BN2``); ``gluon_wgrad`` refuses it."""
        if self.resident_k:
            return False
        if self.pingpong:
            return not self.BN2
        return bool(self.plain_store or self.defer or self.BN2)

    def smem_bytes(self) -> int:
        """Shared memory the kernel allocates (bytes): operand ring, output ring, barriers. Triton's
        own figure (sm_90, triton 3.6.0) is at most this: tests/kernels/test_gluon.py compiles each table entry."""
        if self.resident_k:
            return (self.resident_k * self.BM + self.STAGES * self.BK * self.BN) * 2 + self.NC * self.BM * self.BN * 2 + 1024
        conversion = self.BM * self.tile_n * 2 if self.plain_store == 1 else 0  # the layout conversion's scratch
        output = 2 * self.wg_store * self.BM * self.BN2 * 2 if self.wg_store else self.NC * self.BM * self.tile_n * 2
        return self.STAGES * (self.BK * self.BM + self.BK * self.tile_n) * 2 + output + conversion + 1024

    def __post_init__(self) -> None:
        if self.BN2 and (
            self.BN2 & (self.BN2 - 1)
            or not 8 <= self.BN2 < self.BN
            or not self.pingpong
            and (self.defer or self.plain_store or self.resident_k)
        ):
            raise ValueError(
                f"GluonConfig.BN2 must be 0 or a power of two in [8, BN) (without pingpong: no defer, "
                f"plain_store or resident_k), got {self}"
            )
        if self.STAGES < 2:
            # A one-stage ring deadlocks from two k-steps up: step c waits for its stage while
            # step c - 1's wgmma, which releases it, is still held.
            raise ValueError(f"GluonConfig.STAGES must be >= 2, got {self.STAGES}")
        if self.plain_store not in (0, 1, 2) or self.plain_store and (self.pingpong or self.defer or self.resident_k):
            raise ValueError(f"GluonConfig.plain_store must be 0, 1 or 2, and 0 with pingpong, defer or resident_k, got {self}")
        if self.wg_store and (self.wg_store < 0 or not self.pingpong or self.BN != 2 * self.BN2 or self.plain_store):
            raise ValueError(
                f"GluonConfig.wg_store must be 0 or, with pingpong and BN = 2 * BN2 (no plain_store), "
                f"the chunk buffers per MMA warpgroup, got {self.wg_store} ({self})"
            )
        if self.resident_k and (self.pingpong or self.resident_k < 0 or self.resident_k % self.BK or not 1 <= self.GROUP_M <= 64):
            raise ValueError(
                f"GluonConfig.resident_k must be 0 or, without pingpong and with GROUP_M in "
                f"1..64, a positive multiple of BK={self.BK}, got {self.resident_k} (GROUP_M {self.GROUP_M})"
            )


@dataclass(frozen=True)
class DswigluGluonConfig:
    """Tile shape and launch parameters of the Gluon dSwiGLU kernel.

    Registers: the partitions share maxnreg x 32 x warps through setmaxnreg (the workers get
    their requests, the MMA partition the rest: ``mma_regs``), and ptxas allocates each
    partition's code under its own count (``GluonConfig.mma_regs``: 232 in a 168-register launch).
    The 8-warp MMA partition of a 128x256 tile needs ~154: with maxnreg 128 the compile failed
    ("Insufficient registers (128) ... target of 154"), so these configs take 12 warps in all
    (65536 / (12 * 32) = 170): 8 MMA + [loader 1 + epilogue 2 + 1 padding].
    The workers share one warpgroup when 1 + epi_warps <= 4 (its setmaxnreg is the larger request)."""

    BM: int = 128
    BN: int = 256
    BK: int = 64
    STAGES: int = 3
    NG: int = 1  # g ring buffers ([BM, BN] bf16 each)
    EPI_M: int = 16  # epilogue piece [EPI_M, EPI_N]
    EPI_N: int = 64
    GROUP_M: int = 8
    num_warps: int = 8  # MMA (default) partition
    epi_warps: int = 2
    maxnreg: int = 168  # launch registers per thread; total_warps() x 32 x maxnreg <= 65536
    load_regs: int = 24
    epi_regs: int = 168

    def name(self) -> str:
        return (
            f"{self.BM}x{self.BN}x{self.BK} S{self.STAGES} NG{self.NG} epi{self.EPI_M}x{self.EPI_N} "
            f"G{self.GROUP_M} w{self.num_warps}+1+{self.epi_warps} r{self.maxnreg}/{self.epi_regs}"
        )

    def smem_bytes(self) -> int:
        return self.STAGES * (self.BM * self.BK + self.BK * self.BN) * 2 + self.NG * self.BM * self.BN * 2 + 1024

    def total_warps(self) -> int:
        return self.num_warps + -(-(1 + self.epi_warps) // 4) * 4

    def mma_regs(self) -> int:
        """setmaxnreg of the default partition (triton's AllocateWarpGroups arithmetic, worker
        partitions placed largest first)."""
        if 1 + self.epi_warps <= 4:
            groups = [(max(self.epi_regs, self.load_regs), 4)]
        else:
            groups = [(self.epi_regs, self.epi_warps), (max(self.load_regs, 16), 4)]
        budget = self.maxnreg * self.num_warps * 32
        budget += sum((self.maxnreg - -(-r // 8) * 8) * 4 * 32 for r, _ in groups)
        return budget // (self.num_warps * 32) // 8 * 8

    def __post_init__(self) -> None:
        if self.EPI_N != 64 or self.BM % self.EPI_M or self.BN % self.EPI_N or self.EPI_M % 8:
            raise ValueError(
                f"{self.name()}: pieces are [EPI_M, 64] with EPI_M a multiple of 8 dividing BM "
                "(one 128-byte-swizzled column block of the g tile, see the kernel)"
            )
        if self.total_warps() * 32 * self.maxnreg > 65536:
            raise ValueError(f"{self.name()}: {self.total_warps()} warps x 32 x {self.maxnreg} registers > 65536")
        if not 24 <= self.mma_regs() <= 256:
            raise ValueError(f"{self.name()}: MMA partition would get {self.mma_regs()} registers (24..256)")


#: Token buckets: a bucket applies to T <= its bound; the last is unbounded ("open" in the JSON).
TOKEN_BUCKETS = (128, 256, 512, 1024, 2048, 4096, 1 << 62)
OPEN_BUCKET = TOKEN_BUCKETS[-1]


def bucket_for(tokens: int) -> int:
    """The token bucket (a ``TOKEN_BUCKETS`` bound) that ``tokens`` falls in: the first bound >= it."""
    for bound in TOKEN_BUCKETS:
        if tokens <= bound:
            return bound
    raise AssertionError("unreachable: the last bucket is unbounded")


def bucket_key(bucket: int) -> str:
    """A bucket's key in the JSON tables: its bound, or "open" for the unbounded one."""
    return "open" if bucket == OPEN_BUCKET else str(bucket)


def parse_bucket(key: str) -> int:
    """The bucket a JSON key names (``bucket_key``'s inverse; a bound must be a ``TOKEN_BUCKETS`` one)."""
    bucket = OPEN_BUCKET if key == "open" else int(key)
    if bucket not in TOKEN_BUCKETS:
        raise ValueError(f"token bucket {key!r} is not one of {[bucket_key(b) for b in TOKEN_BUCKETS]}")
    return bucket


TUNED_CONFIGS_PATH = Path(__file__).with_name("backward_configs.json")
KERNELS = ("dswiglu", "grad_weights", "grad_x")

#: The tl kernels' configuration per kernel and bucket (``backward.config_for``; a bucket without an
#: entry takes ``KernelConfig()``).
CONFIGS: dict[str, dict[int, KernelConfig]] = {k: {} for k in KERNELS}
#: The Gluon weight-gradient kernel (``gluon_wgrad``) per bucket where it measured faster than the
#: tl kernel; None: the tl kernel.
GLUON_CONFIGS: dict[int, GluonConfig | None] = {b: None for b in TOKEN_BUCKETS}
#: The Gluon grad_x (the lab's ``swiglu_lab.experiments.gluon_wgrad_probe.launch_grad_x_gluon``, run
#: once imported) per bucket where it measured faster than the tl grad_x kernel; None: the tl kernel
#: (every bucket: it measured slower, data/tuning/gluon_grad_x_probe_96ffe16_20261202.csv).
GLUON_GRAD_X: dict[int, GluonConfig | None] = {b: None for b in TOKEN_BUCKETS}
#: The Gluon dSwiGLU kernel (``gluon_dswiglu``) per bucket where it measured faster; None: tl.
GLUON_DSWIGLU: dict[int, DswigluGluonConfig | None] = {b: None for b in TOKEN_BUCKETS}
#: Per (hidden_size, intermediate_size), the buckets where another Gluon dSwiGLU config measured
#: faster at that shape than ``GLUON_DSWIGLU``'s (tuned at Hermes' size): it replaces that entry there.
GLUON_DSWIGLU_BY_SHAPE: dict[tuple[int, int], dict[int, DswigluGluonConfig]] = {}


def parse_shape(key: str) -> tuple[int, int]:
    """``"HxI"`` (a ``gluon_dswiglu_by_shape`` key) -> (hidden_size, intermediate_size)."""
    try:
        hidden, inter = (int(v) for v in key.split("x"))
    except ValueError:
        raise ValueError(f"shape key {key!r} is not 'HIDDENxINTERMEDIATE'") from None
    return hidden, inter


def parse_by_shape(section: dict, make) -> dict:
    """A table's per-shape section (``{"HxI": {bucket key: entry}}``) as
    ``{(hidden_size, intermediate_size): {bucket: make(entry)}}``."""
    return {parse_shape(shape): {parse_bucket(k): make(e) for k, e in buckets.items()} for shape, buckets in section.items()}


def shape_choice(table: dict, by_shape: dict, bucket: int, shape: tuple[int, int] | None):
    """``by_shape[shape][bucket]`` where that shape has its own entry for the bucket (a
    ``parse_by_shape`` table; the entry may be None), else ``table[bucket]``."""
    own = by_shape.get(shape)
    return own[bucket] if own is not None and bucket in own else table[bucket]


def _load(path: Path) -> None:
    table = json.loads(path.read_text())
    for kernel, buckets in table["configs"].items():
        for key, entry in buckets.items():
            CONFIGS[kernel][parse_bucket(key)] = KernelConfig(**entry["config"])
    for key, entry in table.get("gluon_grad_weights", {}).items():
        GLUON_CONFIGS[parse_bucket(key)] = GluonConfig(**entry["config"])
    for key, entry in table.get("gluon_grad_x", {}).items():
        GLUON_GRAD_X[parse_bucket(key)] = GluonConfig(**entry["config"])
    for key, entry in table.get("gluon_dswiglu", {}).items():
        GLUON_DSWIGLU[parse_bucket(key)] = DswigluGluonConfig(**entry["config"])
    GLUON_DSWIGLU_BY_SHAPE.update(
        parse_by_shape(table.get("gluon_dswiglu_by_shape", {}), lambda e: DswigluGluonConfig(**e["config"]))
    )


_load(TUNED_CONFIGS_PATH)


def table_shared_memory() -> int:
    """The largest shared-memory estimate over the tl table (bytes per block): what a device must
    offer for impl="triton" to run at every T (``devices.device_reason``)."""
    return max((estimate_shared_memory(k, c) for k, table in CONFIGS.items() for c in table.values()), default=0)
