"""A dry run's figures beside perfmodel's: the printed table per rank and the ``--json`` document.

JSON: ``{"config": {...}, "ranks": [{"rank", "coord", "peak_bytes", "predicted_peak_bytes", "moment", "memory":
{category: bytes}, "predicted_memory": {...}, "comm_bytes": {dim: bytes}, "predicted_comm_bytes": {dim: bytes},
"comm": [{"dim", "op", "calls", "bytes", "predicted_calls", "predicted_bytes"}], "seconds", "predicted_step",
"not_modelled"}],
"agree": bool, "disagreements": [str], "fits": bool, "machine_memory_bytes", "usable_memory_bytes"}`` (``fits``: the
largest measured peak within ``usable_memory_bytes``, the fraction of the machine's memory perfmodel plans with). A
figure perfmodel does not model for the model's family (a Hugging Face config's activations, say) is ``null`` in
the JSON and "not modelled" in the table, and ``not_modelled`` says which; it is not compared. ``seconds`` is this host's time to run the step on fake
devices (no GPU's); ``predicted_step`` perfmodel's seconds per batch on the machine with its error band.
"""
from __future__ import annotations

from typing import Optional

from .config import CATEGORIES, DryRunConfig, Prediction, bytes_by_dim

#: the peak may differ from perfmodel's by this fraction (the categories measured exactly must agree to the byte)
PEAK_TOLERANCE = 0.05
#: categories perfmodel models to the byte (temporaries are the rest of the peak: compared through the peak; the
#: buckets against perfmodel's bound, :func:`bucket_bounds`)
EXACT = tuple(c for c in CATEGORIES if c not in ("buckets", "temporaries"))


def human(n: float) -> str:
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{sign}{n / scale:.2f} {unit}"
    return f"{sign}{int(n)} B"


def size(n: Optional[int]) -> str:
    """A size for a table column: ``human(n)``; a negative one (a "rest of the peak" whose parts add up to more
    than the peak) is never printed as a size: "none left" (the difference column says by how much)."""
    if n is None:
        return NOT_MODELLED
    return human(n) if n >= 0 else "none left"


def _diff(got: int, want: int) -> str:
    if got == want:
        return "equal"
    rel = f" ({(got - want) / want:+.2%})" if want else ""
    return f"{'+' if got > want else '-'}{human(abs(got - want))}{rel}"


#: what the table shows in perfmodel's column for a figure perfmodel does not model
NOT_MODELLED = "not modelled"


def bucket_bounds(zero: int, p: Prediction) -> tuple[int, Optional[int]]:
    """What the data-parallel buckets may allocate in the backward, as perfmodel models it (and
    tests/ranks/test_memory_agreement.py checks it): zero=0 nothing but the used-flags in flight behind the last
    bucket (``Prediction.used_flags``; the gradients are the buckets); zero=1 up to a backend's copies of the
    buckets it reduce-scatters (at most the gradients); zero=2 its full buckets, at most what perfmodel lets be
    alive at once (``dp_buckets``, an upper bound)."""
    return {0: (0, p.used_flags), 1: (0, p.memory["gradients"]), 2: (0, p.memory["buckets"])}[zero]


def disagreements(m, p: Prediction, zero: int = 0) -> list[str]:
    """Where the measure ``m`` (:class:`~axgrid.dryrun.step.RankMeasure`) and perfmodel differ beyond what the
    agreement allows: bytes and calls of every collective exactly, the modelled categories to the byte (the
    buckets within :func:`bucket_bounds`), the peak within :data:`PEAK_TOLERANCE`."""
    out = []
    for key in sorted(set(m.comm) | set(p.comm)):
        got, want = m.comm.get(key, (0, 0)), p.comm.get(key, (0, 0))
        if got != want:
            out.append(f"rank {m.rank} {key[0]} {key[1]}: {got[0]} calls {got[1]} B measured, {want[0]} calls "
                       f"{want[1]} B predicted")
    low, high = bucket_bounds(zero, p)
    if high is not None and not low <= m.memory["buckets"] <= high:
        out.append(f"rank {m.rank} buckets: {m.memory['buckets']} B measured, {low} to {high} B allowed (zero={zero})")
    for c in EXACT:
        if p.memory[c] is not None and m.memory[c] != p.memory[c]:
            out.append(f"rank {m.rank} {c}: {m.memory[c]} B measured, {p.memory[c]} B predicted")
    if p.peak is not None and abs(m.peak / p.peak - 1) > PEAK_TOLERANCE:
        out.append(f"rank {m.rank} peak: {human(m.peak)} measured, {human(p.peak)} predicted "
                   f"({m.peak / p.peak - 1:+.1%}, beyond {PEAK_TOLERANCE:.0%})")
    return out


def table(cfg: DryRunConfig, m, p: Prediction) -> str:
    """One rank's figures beside perfmodel's."""
    coord = " ".join(f"{k}{v}" for k, v in m.coord.items())
    lines = [f"rank {m.rank} ({coord}) of {cfg.grid}: this host ran the step on fake devices in {m.seconds:.1f} s "
             f"(host time, not a GPU's); perfmodel: {p.step or 'no time'}",
             f"  {'memory':<14}{'dry run':>14}{'perfmodel':>14}  difference"]
    low, high = bucket_bounds(cfg.zero, p)
    for c in CATEGORIES:
        diff = _diff(m.memory[c], p.memory[c]) if p.memory[c] is not None else ""
        if c == "buckets" and high:               # zero >= 1, or zero 0's used-flags in flight over d
            diff = f"{'within' if low <= m.memory[c] <= high else 'OUTSIDE'} perfmodel's bound (zero={cfg.zero}" + (
                f": the used-flags, at most {human(high)})" if cfg.zero == 0 else ")")
        elif c == "temporaries":
            over = [f"{who}'s other categories exceed its peak by {human(-n)}"
                    for who, n in (("the dry run", m.memory[c]), ("perfmodel", p.memory[c])) if n is not None and n < 0]
            diff = "the rest of the peak" + (f": {'; '.join(over)}" if over else f", {diff}" if diff else "")
        lines.append(f"  {c:<14}{size(m.memory[c]):>14}{size(p.memory[c]):>14}  {diff}")
    lines.append(f"  {'peak':<14}{human(m.peak):>14}{size(p.peak):>14}  "
                 f"{_diff(m.peak, p.peak) if p.peak is not None else ''}")
    if p.not_modelled:
        lines.append(f"  perfmodel: {p.not_modelled}")
    lines.append(f"  peak reached at: {m.moment}")
    lines.append(f"  {'collective':<22}{'calls':>8}{'bytes':>18}{'perfmodel':>18}  difference")
    for key in sorted(set(m.comm) | set(p.comm)):
        (calls, got), (pcalls, want) = m.comm.get(key, (0, 0)), p.comm.get(key, (0, 0))
        d = "equal" if (calls, got) == (pcalls, want) else f"{got - want:+d} B, {calls - pcalls:+d} calls"
        lines.append(f"  {key[0] + ' ' + key[1]:<22}{calls:>8}{got:>18,}{want:>18,}  {d}")
    bd, pd = bytes_by_dim(m.comm), bytes_by_dim(p.comm)
    lines.append("  bytes per dimension: " + ", ".join(
        f"{d} {human(bd.get(d, 0))} ({_diff(bd.get(d, 0), pd.get(d, 0))})" for d in sorted(set(bd) | set(pd))))
    if m.host_violations:
        lines.append(f"  host traffic in the step ({len(m.host_violations)}): " + "; ".join(m.host_violations[:5]))
    return "\n".join(lines)


def rank_json(m, p: Prediction) -> dict:
    keys = sorted(set(m.comm) | set(p.comm))
    return {"rank": m.rank, "coord": m.coord, "peak_bytes": m.peak, "predicted_peak_bytes": p.peak,
            "moment": m.moment, "memory": dict(m.memory), "predicted_memory": dict(p.memory),
            "comm_bytes": bytes_by_dim(m.comm), "predicted_comm_bytes": bytes_by_dim(p.comm),
            "comm": [{"dim": d, "op": o, "calls": m.comm.get((d, o), (0, 0))[0],
                      "bytes": m.comm.get((d, o), (0, 0))[1], "predicted_calls": p.comm.get((d, o), (0, 0))[0],
                      "predicted_bytes": p.comm.get((d, o), (0, 0))[1]} for d, o in keys],
            "seconds": round(m.seconds, 3), "predicted_step": p.step, "host_violations": m.host_violations, "not_modelled": p.not_modelled}
