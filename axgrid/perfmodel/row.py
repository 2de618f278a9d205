"""One priced configuration (a row of the ranking table)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Row:
    """One configuration. Times in seconds per batch, memory in bytes per GPU, bytes per step per dimension."""

    rank: int | None
    grid: tuple[int, int, int, int]
    feasible: bool
    reason: str
    time_s: float
    tflops_per_gpu: float
    pct_peak: float
    memory_bytes: float
    microbatches: int
    compute_s: float       # GEMMs (attention as GEMMs) + element-wise kernels (``elementwise_s``, included)
    exposed_s: dict[str, float] = field(default_factory=dict)
    raw_comm_s: dict[str, float] = field(default_factory=dict)
    step_bytes: dict[str, float] = field(default_factory=dict)
    memory_parts: dict[str, float] = field(default_factory=dict)
    dp_buckets: int = 0  # data-parallel gradient buckets (collectives per step; 0 when Gd = 1)
    zero: int = 0        # the runtime's RuntimeConfig.zero this row is priced with (4D rows)
    layout: str = "4D"   # "4D" (Gx×Gy×Gz×Gd) or "TPxPPxDP" (Megatron-style; grid = (1, TP, 1, DP))
    pp: int = 1          # pipeline stages (TPxPPxDP rows)
    vpp: int = 1         # interleaved model chunks per stage (1 = plain 1F1B)
    sp: bool = False     # sequence parallel
    bubble_s: float = 0.0  # pipeline bubble: (PP−1)/VPP stage-slots of one micro-batch
    p2p_s: float = 0.0     # activation sends between stages, exposed
    recompute: str = ""    # TPxPPxDP named with its own recompute ("full"/"selective"/"none"); "": the problem's
    elementwise_s: float = 0.0  # the element-wise kernels' HBM time inside compute_s (0: not priced on the machine)
    time_low: float = 0.0  # the model's error band on this machine around time_s (``perfmodel.band``); 0 = not set
    time_high: float = 0.0
    within_error: bool = False  # band overlaps the best row's: not told apart from the best by the model
    out_of_range: str = ""      # why this prediction lies outside what was validated on the machine ("" = inside)
    ep: int = 1                 # expert-parallel size (a split of Gd; ``perfmodel.moe``), 1 for a dense model
    all_to_all_s: float = 0.0   # the MoE dispatch/combine all-to-alls' seconds per batch (in d's exposed time)
    all_to_all_bytes: float = 0.0  # ... the bytes one GPU sends off itself in them per batch (in d's bytes)
    cp: int = 1                 # context-parallel size of a 4D row (axgrid.init(..., cp=N); 1: none)

    @property
    def config_str(self) -> str:
        """:attr:`grid_str`, with ``+cpN`` under context parallelism (``1x1x8x8+cp8``: the dry run's ``--grid``
        reads it back)."""
        return self.grid_str + (f"+cp{self.cp}" if self.cp > 1 else "")

    @property
    def grid_str(self) -> str:
        """``2x4x8x16`` for a 4D grid (``2x4x8x16/ep8`` with expert parallelism); ``TP4xPP8xDP32`` (``v2`` interleaved, ``+SP``) for TP×PP×DP."""
        if self.layout == "4D":
            return "x".join(str(v) for v in self.grid) + (f"/ep{self.ep}" if self.ep > 1 else "")
        return (f"TP{self.grid[1]}xPP{self.pp}xDP{self.grid[3]}" + (f"v{self.vpp}" if self.vpp > 1 else "")
                + ("+SP" if self.sp else "") + (f"/{self.recompute}" if self.recompute else ""))
