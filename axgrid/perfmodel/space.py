"""The search space: every (Gx, Gy, Gz, Gd) with Gx·Gy·Gz·Gd = GPUs, and the model's divisibility rules.

Rules (checked vectorised, one boolean array per rule so every rejection carries a reason):
  hidden and 4·hidden divisible by Gx and Gy (both FC orientations split h and 4h over x and y);
  heads divisible by Gy (QKV is a normal layer: its 3h output features, i.e. whole heads, are split over y);
  vocab divisible by Gy (the LM head's output and the vocabulary-parallel cross entropy are split over y);
  global batch divisible by Gd, and by Gd·Gz (the GPT splits tokens over (d, z) by whole sequences: attention
  needs whole sequences on one rank).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from axgrid.spec import TransformerShape

from .errors import PerfModelError


def divisors(n: int) -> np.ndarray:
    """Sorted positive divisors of n, as int64."""
    if n <= 0:
        raise PerfModelError(f"need a positive number, got {n}")
    small = [i for i in range(1, int(n**0.5) + 1) if n % i == 0]
    return np.array(sorted(set(small + [n // i for i in small])), dtype=np.int64)


@dataclass(frozen=True)
class Grids:
    """N grid configurations as int64 arrays of shape [N]."""

    gx: np.ndarray
    gy: np.ndarray
    gz: np.ndarray
    gd: np.ndarray
    ep: np.ndarray | None = None     # expert-parallel sizes (a split of d; ``perfmodel.moe``); None: 1 everywhere

    def __len__(self) -> int:
        return int(self.gx.shape[0])

    @property
    def eps(self) -> np.ndarray:
        """The expert-parallel size of each grid [N] (1 where none is set)."""
        return np.ones_like(self.gd) if self.ep is None else self.ep

    def with_expert_parallel(self, sizes) -> "Grids":
        """Each grid once per EP size ``sizes(gd)`` gives it (a list of ints; ``perfmodel.moe.ep_sizes``)."""
        rows = [(*t, e) for t in self.tuples() for e in sizes(t[3])]
        return Grids.of(rows)

    def tuples(self) -> list[tuple[int, int, int, int]]:
        return list(zip(self.gx.tolist(), self.gy.tolist(), self.gz.tolist(), self.gd.tolist()))

    @staticmethod
    def of(tuples: list[tuple[int, ...]]) -> "Grids":
        """Grids of (gx, gy, gz, gd) tuples, or (gx, gy, gz, gd, ep) with an expert-parallel size."""
        width = len(tuples[0]) if len(tuples) else 4
        a = np.asarray(tuples, dtype=np.int64).reshape(-1, width)
        return Grids(a[:, 0].copy(), a[:, 1].copy(), a[:, 2].copy(), a[:, 3].copy(),
                     a[:, 4].copy() if width == 5 else None)

    def take(self, idx: np.ndarray) -> "Grids":
        return Grids(self.gx[idx], self.gy[idx], self.gz[idx], self.gd[idx],
                     None if self.ep is None else self.ep[idx])


def enumerate_grids(gpus: int) -> Grids:
    """All ordered 4-way factorisations of ``gpus`` (x, y, z, d), lexicographic order."""
    d = divisors(gpus)
    gx, gy = np.meshgrid(d, d, indexing="ij")
    gx, gy = gx.ravel(), gy.ravel()
    ok = gpus % (gx * gy) == 0
    gx, gy = gx[ok], gy[ok]
    rest = gpus // (gx * gy)
    # z: every divisor of rest; do it with one broadcast over d (rest's divisors are divisors of gpus).
    gz = np.broadcast_to(d, (gx.size, d.size))
    ok = rest[:, None] % gz == 0
    rows, cols = np.nonzero(ok)
    gx, gy, gzv = gx[rows], gy[rows], d[cols]
    gd = gpus // (gx * gy * gzv)
    return Grids(gx, gy, gzv, gd)


RULES = (
    "hidden % Gx",
    "hidden % Gy",
    "heads % Gy",
    "vocab % Gy",
    "batch % Gd",
    "batch % (Gd*Gz)",
    "batch/Gd % microbatches",
)


def divisibility(spec: TransformerShape, batch: int, grids: Grids, microbatches: int | None,
                 cp: int = 1) -> dict[str, np.ndarray]:
    """Rule name → bool array [N], True where the rule is VIOLATED: the GPT's :data:`RULES`; a decoder's sizes
    by ``TransformerShape.grid_rules`` ("num_key_value_heads % Gy", ...) and the batch rules. With context
    parallelism (``cp`` > 1) a sequence spans ``cp`` z-ranks: the batch splits over Gd·Gz/cp groups, and ``cp``
    must divide Gz ("Gz % cp")."""
    h = spec.hidden
    size = {"x": grids.gx, "y": grids.gy, "z": grids.gz, "d": grids.gd}
    if spec.is_gpt:
        out = {
            "hidden % Gx": (h % grids.gx != 0) | (spec.ffn % grids.gx != 0),
            "hidden % Gy": (h % grids.gy != 0) | (spec.ffn % grids.gy != 0),
            "heads % Gy": spec.heads % grids.gy != 0,
            "vocab % Gy": spec.vocab % grids.gy != 0,
        }
    else:
        out = {}
        for what, value, dim in spec.grid_rules():
            key = f"{what} % G{dim}"
            out[key] = out.get(key, False) | (value % size[dim] != 0)
    if spec.is_moe or grids.ep is not None:      # expert parallelism: ep divides Gd and the experts
        out["ep % Gd"] = grids.gd % grids.eps != 0
        out["experts % ep"] = (spec.experts % grids.eps != 0) if spec.is_moe else grids.eps != 1
    out["batch % Gd"] = batch % grids.gd != 0
    out["batch % (Gd*Gz)"] = batch % (grids.gd * grids.gz) != 0
    if cp > 1:
        out["Gz % cp"] = grids.gz % cp != 0
        out["batch % (Gd*Gz)"] = (grids.gz % cp != 0) | (batch % np.maximum(grids.gd * grids.gz // cp, 1) != 0)
    if microbatches is not None:
        out["batch/Gd % microbatches"] = (batch % grids.gd != 0) | ((batch // grids.gd) % microbatches != 0)
    return out


def describe(rule: str, spec: TransformerShape, batch: int, g: tuple[int, int, int, int], mb: int | None) -> str:
    """A readable reason for one violated rule on one grid."""
    gx, gy, gz, gd = g[:4]
    if rule in ("ep % Gd", "experts % ep"):
        from .moe import ep_reasons
        return "; ".join(ep_reasons(spec, gd, g[4] if len(g) > 4 else 1))
    if not spec.is_gpt and rule not in RULES and rule != "Gz % cp":            # a decoder's size rule, "<field> % G<dim>": its own line
        what, dim = rule.split(" % G")
        return next(line for line in spec.divisibility(g) if line.startswith(f"{what} ") and f" by G{dim}=" in line)
    return {
        "hidden % Gx": f"hidden {spec.hidden} not divisible by Gx={gx}",
        "hidden % Gy": f"hidden {spec.hidden} not divisible by Gy={gy}",
        "heads % Gy": f"heads {spec.heads} not divisible by Gy={gy}",
        "vocab % Gy": f"vocab {spec.vocab} not divisible by Gy={gy} (the LM head and cross entropy split it)",
        "batch % Gd": f"batch {batch} not divisible by Gd={gd}",
        "batch % (Gd*Gz)": f"batch {batch} not divisible by Gd*Gz={gd * gz} (z splits whole sequences)",
        "batch/Gd % microbatches": f"local batch {batch}/{gd} not divisible by {mb} micro-batches",
        "Gz % cp": f"Gz={gz} not divisible by the context-parallel size (a sequence spans cp z-ranks)",
    }[rule]
