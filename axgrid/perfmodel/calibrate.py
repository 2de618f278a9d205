"""Calibration: fit α, β per placement class and a GEMM efficiency curve from measured samples, and write a
machine file. The fitting is pure numpy/scipy; the samples are measured on real ranks by
``python -m axgrid.measure collectives`` (JSON read by ``load_samples``), or come from anywhere else:
``calibrate(comm_samples, gemm_samples, ...)``.

Sample formats:
  comm: {"op": "all_reduce"|"all_gather"|"reduce_scatter", "group_size": p, "stride": s, "bytes": S,
         "seconds": t, "concurrent": rings sharing the node's NICs (default 1)}
        S is the ledger's buffer size (all-reduced tensor / AG output / RS input).
  gemm: {"m": m, "n": n, "k": k, "seconds": t, "dtype": "fp32"}
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterable

import numpy as np
from scipy.optimize import least_squares, nnls

from .errors import PerfModelError
from .machines import CPU_RANK, GemmRecord, Machine, Placement, machine_to_toml


@dataclass(frozen=True)
class CommSample:
    op: str
    group_size: int
    stride: int
    bytes: int
    seconds: float
    concurrent: int = 1


@dataclass(frozen=True)
class GemmSample:
    m: int
    n: int
    k: int
    seconds: float
    dtype: str = "fp32"


def placement_class(group_size: int, stride: int, gpus_per_node: int) -> str:
    """"intra" when the whole ring sits in one node (same rule as the model), else "inter"."""
    span = group_size * stride
    return "intra" if span <= gpus_per_node and gpus_per_node % span == 0 else "inter"


def _coeffs(s: CommSample) -> tuple[float, float]:
    """t = c_alpha·α + c_beta·(1/β): ring all-reduce 2(p−1), 2(p−1)/p·S; AG/RS (p−1), (p−1)/p·S."""
    p = s.group_size
    f = 2.0 if s.op == "all_reduce" else 1.0
    if s.op not in ("all_reduce", "all_gather", "reduce_scatter"):
        raise PerfModelError(f"unknown collective {s.op!r} in calibration sample")
    return f * (p - 1), f * (p - 1) / p * s.bytes * s.concurrent


def fit_alpha_beta(samples: Iterable[CommSample]) -> Placement:
    """Least-squares α [s] and β [bytes/s] (relative residuals, positive by construction) from ≥ 2 samples
    over groups of size > 1."""
    ss = [s for s in samples if s.group_size > 1 and s.seconds > 0]
    if len(ss) < 2:
        raise PerfModelError(f"need at least 2 samples with group size > 1 to fit α, β (got {len(ss)})")
    A = np.array([_coeffs(s) for s in ss])
    t = np.array([s.seconds for s in ss])
    x0, _ = nnls(A / t[:, None], np.ones_like(t))  # relative-error linear fit as a start
    x0 = np.maximum(x0, [1e-9, 1e-13])

    def res(logx: np.ndarray) -> np.ndarray:
        return (A @ np.exp(logx) - t) / t

    fit = least_squares(res, np.log(x0), method="lm" if len(ss) > 2 else "trf")
    alpha, inv_beta = np.exp(fit.x)
    return Placement(alpha=float(alpha), beta=float(1.0 / max(inv_beta, 1e-15)))  # latency-only samples: β ≤ 1 PB/s


def fit_placements(samples: Iterable[CommSample], gpus_per_node: int) -> dict[str, Placement]:
    """α, β per placement class present in the samples (classes with < 2 usable samples are skipped)."""
    by: dict[str, list[CommSample]] = {}
    for s in samples:
        by.setdefault(placement_class(s.group_size, s.stride, gpus_per_node), []).append(s)
    return {cls: fit_alpha_beta(ss) for cls, ss in by.items() if len([x for x in ss if x.group_size > 1]) >= 2}


def fit_gemm_curve(samples: Iterable[GemmSample], peak: float) -> tuple[float, float]:
    """Fit eff(m,n,k) = eff_max · d/(d + dim_half), d = min(m,n,k), to measured times at ``peak`` FLOP/s;
    returns (eff_max in (0, 1], dim_half > 0)."""
    ss = [s for s in samples if s.seconds > 0]
    if len(ss) < 2:
        raise PerfModelError(f"need at least 2 GEMM samples to fit the efficiency curve (got {len(ss)})")
    d = np.array([min(s.m, s.n, s.k) for s in ss], float)
    eff = np.array([2.0 * s.m * s.n * s.k / s.seconds / peak for s in ss])

    def res(x: np.ndarray) -> np.ndarray:
        e_max, log_half = x
        pred = e_max * d / (d + np.exp(log_half))
        return (pred - eff) / eff  # relative error of the rate = relative error of the time, to first order

    x0 = np.array([min(1.0, eff.max() * 1.1), np.log(max(float(np.median(d)) / 4, 1.0))])
    fit = least_squares(res, x0, bounds=([1e-6, -10.0], [1.0, 20.0]))
    return float(fit.x[0]), float(np.exp(fit.x[1]))


def calibrate(comm_samples: list[CommSample], gemm_samples: list[GemmSample], base: Machine,
              name: str = "local", out: str | Path | None = None, peak: float | None = None) -> Machine:
    """Fit everything and return (and write to ``out`` as TOML, if given) a machine derived from ``base``.

    ``peak``: the dense peak FLOP/s to express efficiencies against (default: base's peak for the samples'
    dtype). Fitted placement classes override the base's spec-sheet bandwidths; the measured GEMMs are kept as
    a table."""
    placement = dict(base.placement)
    placement.update(fit_placements(comm_samples, base.gpus_per_node))
    kw: dict = {"name": name, "placement": placement}
    if gemm_samples:
        dtype = gemm_samples[0].dtype
        pk = peak or base.peak_flops(dtype)
        kw["gemm_eff_max"], kw["gemm_dim_half"] = fit_gemm_curve(gemm_samples, pk)
        kw["gemm_table"] = tuple(GemmRecord(s.m, s.n, s.k, s.dtype, 2.0 * s.m * s.n * s.k / s.seconds)
                                 for s in gemm_samples if s.seconds > 0)
    if "intra" in placement:
        kw["intra_node_latency"], kw["intra_node_bandwidth"] = placement["intra"].alpha, placement["intra"].beta
    if "inter" in placement:
        kw["inter_node_latency"] = placement["inter"].alpha
        kw["inter_node_bandwidth_per_nic"] = placement["inter"].beta / base.nics_per_node
    m = replace(base, **kw)
    if out is not None:
        fitted = set(placement) - set(base.placement)
        how = f"fitted from {len(comm_samples)} measured collectives"
        sources = {"intra_node_bandwidth": how if "intra" in fitted else f"base machine {base.name}",
                   "intra_node_latency": how if "intra" in fitted else f"base machine {base.name}",
                   "inter_node_bandwidth_per_nic": how if "inter" in fitted else f"base machine {base.name} "
                                                                                 "(not measured: one host)",
                   "inter_node_latency": how if "inter" in fitted else f"base machine {base.name} "
                                                                       "(not measured: one host)",
                   "peak_flops_bf16": f"base machine {base.name} (local: the fastest of the measured GEMMs per "
                                      "rank, or --peak)",
                   "peak_flops_fp32": f"base machine {base.name} (local: the fastest of the measured GEMMs per "
                                      "rank, or --peak)",
                   "gpus_per_node": f"base machine {base.name} (local: the ranks measured, all on this host)",
                   "memory_bytes": f"base machine {base.name} (local: host RAM / ranks)",
                   "nics_per_node": f"base machine {base.name}"}
        write_machine(m, out, comment=f"written by perfmodel calibrate from {len(comm_samples)} collective and "
                                      f"{len(gemm_samples)} GEMM samples (base: {base.name})", sources=sources)
    return m


def write_machine(m: Machine, path: str | Path, comment: str = "", sources: dict[str, str] | None = None) -> Path:
    """Write ``m`` as a machine TOML (atomically: temp file + rename). Every top-level field gets a
    ``# source:`` comment (the library's rule): ``sources[field]`` when given, else "perfmodel calibrate"."""
    from .machines import REQUIRED
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    src = sources or {}
    lines = []
    for line in machine_to_toml(m, comment).splitlines():
        key = line.split(" = ", 1)[0] if " = " in line else ""
        if key in REQUIRED and key != "name" and "# source:" not in line:
            line += f"  # source: {src.get(key, 'perfmodel calibrate')}"
        lines.append(line)
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, p)
    return p


def local_base(nranks: int, peak_flops: float, memory_bytes: int | None = None) -> Machine:
    """A starting machine for this host: one 'node' of ``nranks`` ranks; bandwidths are placeholders that the
    fit replaces (intra), inter-node copies intra (there is no second node to measure)."""
    mem = memory_bytes or int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // max(nranks, 1))
    return Machine(name="local", gpus_per_node=nranks, peak_flops_bf16=peak_flops, peak_flops_fp32=peak_flops,
                   memory_bytes=mem, intra_node_bandwidth=1e9, intra_node_latency=1e-4,
                   inter_node_bandwidth_per_nic=1e9, inter_node_latency=1e-4, nics_per_node=1,
                   description=f"this host, {nranks} gloo ranks (calibrated)", gpu=CPU_RANK)


MEASURE_COMMAND = "axgrid launch -n 4 -- python -m axgrid.measure collectives --out {path}"


@dataclass(frozen=True)
class Samples:
    """What ``python -m axgrid.measure collectives`` wrote: the samples and the ranks they were measured on
    (``nranks``; for a file without it, the widest group measured)."""
    comm: list[CommSample]
    gemm: list[GemmSample]
    nranks: int


def load_samples(path: str | Path) -> Samples:
    """Read {"comm": [...], "gemm": [...], "nranks": n} JSON (formats in the module docstring); a missing or
    malformed file is a one-line PerfModelError naming it and the command that writes it."""
    fix = f"write it with `{MEASURE_COMMAND.format(path=path)}`"
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as e:
        raise PerfModelError(f"calibration samples {path}: {e.strerror or e}; {fix}") from None
    except ValueError as e:
        raise PerfModelError(f"calibration samples {path} are not JSON ({e}); {fix}") from None
    try:
        if not isinstance(doc, dict) or not doc.get("comm"):
            raise TypeError("no 'comm' samples")
        comm = [CommSample(**{k: v for k, v in d.items() if k in CommSample.__dataclass_fields__})
                for d in doc["comm"]]
        gemm = [GemmSample(**{k: v for k, v in d.items() if k in GemmSample.__dataclass_fields__})
                for d in doc.get("gemm", [])]
    except (TypeError, AttributeError) as e:
        raise PerfModelError(f"calibration samples {path}: bad sample ({e}); {fix}") from None
    nranks = doc.get("nranks") or max(c.group_size * c.stride for c in comm)
    return Samples(comm, gemm, int(nranks))


def save_samples(path: str | Path, comm: list[CommSample], gemm: list[GemmSample]) -> None:
    """Write samples in the format :func:`load_samples` reads (synthetic or converted measurements)."""
    Path(path).write_text(json.dumps({"comm": [asdict(c) for c in comm], "gemm": [asdict(g) for g in gemm]},
                                     indent=1))


def model_gemm_shapes(spec, batch: int, gpus: int, microbatches: int = 1, limit: int = 48
                      ) -> list[tuple[int, int, int]]:
    """The (m, n, k) GEMMs the model would time for ``spec`` on the grids of ``gpus`` that divide evenly:
    forward (m', n_loc, k_loc), input gradient (m', k_loc, n_loc), weight gradient (n_loc, k_loc, m') of every
    FC layer, and attention (S, S, head_dim). Distinct shapes, at most ``limit`` (evenly thinned by size)."""
    from .comm import layer_volumes
    from .space import enumerate_grids

    g = enumerate_grids(gpus)
    tokens = batch // microbatches * spec.seq
    ok = (tokens % (g.gd * g.gz) == 0) & (spec.hidden % g.gx == 0) & (spec.hidden % g.gy == 0)
    shapes: set[tuple[int, int, int]] = {(spec.seq, spec.seq, spec.hidden // spec.heads)}
    for layer in spec.block_layers() + [spec.head_layer()]:
        for gx, gy, gz, gd in zip(g.gx[ok], g.gy[ok], g.gz[ok], g.gd[ok]):
            v = layer_volumes(layer, gx, gy, gz, tokens // (gd * gz))
            m, n, k = int(tokens // (gd * gz)), int(v.n_loc), int(v.k_loc)
            shapes |= {(m, n, k), (m, k, n), (n, k, m)}
    out = sorted(shapes, key=lambda s: (s[0] * s[1] * s[2], s))
    if len(out) > limit:
        idx = np.unique(np.linspace(0, len(out) - 1, limit).round().astype(int))
        out = [out[i] for i in idx]
    return out


def fit_by_group(samples: Iterable[CommSample]) -> dict[tuple[int, int], Placement]:
    """Diagnostic: α, β fitted separately for every (group size, stride) measured (the original system's table
    was indexed this way); groups with < 2 samples are skipped."""
    by: dict[tuple[int, int], list[CommSample]] = {}
    for s in samples:
        if s.group_size > 1:
            by.setdefault((s.group_size, s.stride), []).append(s)
    return {k: fit_alpha_beta(v) for k, v in sorted(by.items()) if len(v) >= 2}


def fit_report(comm: list[CommSample], m: Machine) -> list[tuple[str, float]]:
    """(label, relative RMS error of the fitted α-β model) per placement class present in ``comm``."""
    out = []
    by: dict[str, list[CommSample]] = {}
    for s in comm:
        if s.group_size > 1:
            by.setdefault(placement_class(s.group_size, s.stride, m.gpus_per_node), []).append(s)
    for cls, ss in sorted(by.items()):
        pl = m.placement_of(cls)
        A = np.array([_coeffs(s) for s in ss])
        t = np.array([s.seconds for s in ss])
        pred = A @ np.array([pl.alpha, 1.0 / pl.beta])
        out.append((cls, float(np.sqrt(np.mean(((pred - t) / t) ** 2)))))
    return out
