"""AxoNN's Frontier weak-scaling series (Singh et al., SC24, arXiv 2502.08145) and the model's prediction of it.

The series: GPT models doubling with the GCD count, 5B on 512 MI250X GCDs to 320B on 32,768 (the sizes of
``axgrid.spec.NAMED_SIZES``), bf16, sequence 2048, one sequence per GCD, each run on the best 4D grid. What the
paper publishes of it (quoted in its text; the per-point bars are a figure we do not hold as numbers):

* weak-scaling efficiency against the 512-GCD run: 88.3% at 8,192 GCDs, 79.02% at 16,384, 53.5% at 32,768
  ("near perfect weak scaling up to 8,192 GCDs ... rising overheads of communication" at 32,768);
* 36.3% of the advertised bf16 peak (191.5 TFLOP/s per GCD) at 8,192 GCDs; 1.381 EFLOP/s = 22.0% at 32,768.

So the 512-GCD run sustained 36.3% / 0.883 = 41.1% of peak (78.7 TFLOP/s per GCD), and 22.0% / 0.535 = 41.1% says
the same: the two quotes agree. Points at 1,024–4,096 GCDs are not quoted: ``published`` is None there.

The prediction is ``perfmodel.rank``'s best feasible 4D grid on the shipped ``frontier`` machine file, with the
check-published points' options (the compute dtype's gradient reductions, recompute and every overlap on)."""
from __future__ import annotations

from dataclasses import dataclass

from .machines import load_machine
from .problem import Options, Problem, get_model
from .rank import rank
from .row import Row

#: (GCDs, model) of the series
SERIES: tuple[tuple[int, str], ...] = (
    (512, "gpt-5b"), (1024, "gpt-10b"), (2048, "gpt-20b"), (4096, "gpt-40b"),
    (8192, "gpt-80b"), (16384, "gpt-160b"), (32768, "gpt-320b"))
#: the published weak-scaling efficiency against the 512-GCD run, where the paper's text gives it
PUBLISHED_EFFICIENCY: dict[int, float] = {512: 1.0, 8192: 0.883, 16384: 0.7902, 32768: 0.535}
#: the published share of the advertised peak, where the paper's text gives it
PUBLISHED_PCT_PEAK: dict[int, float] = {8192: 0.363, 32768: 1.381e18 / 32768 / 191.5e12}
SOURCE = ("Singh et al., 'Democratizing AI: Open-source Scalable LLM Training on GPU-based Supercomputers', "
          "SC24 (arXiv 2502.08145), section on weak scaling on Frontier, as quoted in Import AI (Feb 2025)")
#: the 512-GCD run's TFLOP/s per GCD implied by the two quotes (36.3% at 8,192 over 88.3%)
BASE_TFLOPS = PUBLISHED_PCT_PEAK[8192] / PUBLISHED_EFFICIENCY[8192] * 191.5


@dataclass(frozen=True)
class Point:
    gcds: int
    model: str
    row: Row
    efficiency: float               # predicted TFLOP/s per GCD over the 512-GCD run's prediction
    published_efficiency: float | None
    published_tflops: float | None  # BASE_TFLOPS × the published efficiency

    @property
    def tflops(self) -> float:
        return self.row.tflops_per_gpu


def predict(machine: str = "frontier", series: tuple[tuple[int, str], ...] = SERIES) -> list[Point]:
    """The model's best 4D grid for every point of ``series`` on ``machine``, and its efficiency against the
    first point."""
    m = load_machine(machine)
    rows = []
    for gcds, model in series:
        prob = Problem(get_model(model), gcds, gcds, "bf16", Options(grad_reduce="bf16"))
        rows.append(rank(prob, m, require_feasible=True).feasible[0])
    base = rows[0].tflops_per_gpu
    out = []
    for (gcds, model), row in zip(series, rows):
        eff = PUBLISHED_EFFICIENCY.get(gcds)
        out.append(Point(gcds, model, row, row.tflops_per_gpu / base, eff,
                         None if eff is None else BASE_TFLOPS * eff))
    return out


__all__ = ["SERIES", "PUBLISHED_EFFICIENCY", "PUBLISHED_PCT_PEAK", "BASE_TFLOPS", "SOURCE", "Point", "predict"]
