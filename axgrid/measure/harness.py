"""The timing harness every benchmark uses: warm-up excluded, configurations interleaved over several rounds
in a shuffled order, median and spread per configuration, ratios computed within a round.

    res = measure({"a": step_a, "b": step_b}, rounds=5, steps_per_round=2, warmup=1, seed=0, barrier=sync)
    print(res.table(baseline="a"))

Why: on a shared 2-core machine the time of one configuration drifts by tens of percent within a run (other
jobs, the first use of a buffer, the order in which things ran). Timing each configuration once, in a fixed
order, measures the order. Here every round runs every configuration (``steps_per_round`` steps each) in a new
shuffled order, so drift hits all of them alike, and a ratio is taken between two configurations *of the same
round* before its median over rounds is reported, so a slow round cancels out of the ratio.

Distributed use: every rank must call :func:`measure` with the same names and seed (the order is drawn from
the seed, so all ranks agree without talking); ``barrier`` lines the ranks up before each timed step. The
samples of all ranks are made one with :meth:`Result.reduced` (e.g. the slowest rank's time per step).
Pure Python: no torch import, so it is testable and usable anywhere.
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence


def round_orders(names: Sequence[str], rounds: int, seed: int) -> list[list[str]]:
    """``rounds`` shuffled copies of ``names``, the same for the same seed (on every rank)."""
    if rounds < 1:
        raise ValueError(f"rounds={rounds} must be >= 1")
    if len(set(names)) != len(names):
        raise ValueError(f"configuration names must be distinct, got {list(names)}")
    rng = random.Random(seed)
    out = []
    for _ in range(rounds):
        order = list(names)
        rng.shuffle(order)
        out.append(order)
    return out


@dataclass(frozen=True)
class Spread:
    """Median and spread of a list of values (seconds per step, or ratios)."""

    median: float
    lo: float            # min
    hi: float            # max
    q1: float
    q3: float
    n: int

    @staticmethod
    def of(values: Sequence[float]) -> "Spread":
        if not values:
            raise ValueError("no values to summarise")
        v = sorted(values)
        if len(v) >= 2:
            q1, _, q3 = statistics.quantiles(v, n=4, method="inclusive")
        else:
            q1 = q3 = v[0]
        return Spread(statistics.median(v), v[0], v[-1], q1, q3, len(v))

    def fmt(self, scale: float = 1.0, digits: int = 1) -> str:
        """``median [min-max]`` scaled, e.g. milliseconds with ``scale=1e3``."""
        f = f"{{:.{digits}f}}"
        return f"{f.format(self.median * scale)} [{f.format(self.lo * scale)}-{f.format(self.hi * scale)}]"


@dataclass
class Result:
    """``samples[name][r]``: the seconds of each timed step of ``name`` in round ``r``; ``orders[r]``: the
    order round ``r`` ran in."""

    samples: dict[str, list[list[float]]]
    orders: list[list[str]]
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return list(self.samples)

    def per_round(self, name: str) -> list[float]:
        """One figure per round: the median of the round's steps."""
        return [statistics.median(steps) for steps in self.samples[name]]

    def spread(self, name: str) -> Spread:
        """Median and spread over rounds of the per-round time per step."""
        return Spread.of(self.per_round(name))

    def ratios(self, a: str, b: str) -> list[float]:
        """``time(a) / time(b)`` within each round."""
        return [x / y for x, y in zip(self.per_round(a), self.per_round(b))]

    def ratio(self, a: str, b: str) -> Spread:
        """Median and spread over rounds of the within-round ratio ``time(a) / time(b)``."""
        return Spread.of(self.ratios(a, b))

    def best(self, names: Optional[Sequence[str]] = None) -> str:
        """The name with the lowest median time per step (among ``names``)."""
        pool = list(names) if names is not None else self.names
        return min(pool, key=lambda n: self.spread(n).median)

    def flat(self) -> list[float]:
        """All samples in a fixed order (names, rounds, steps): for reducing over ranks."""
        return [t for n in self.names for steps in self.samples[n] for t in steps]

    def reduced(self, reduce: Callable[[list[float]], Sequence[float]]) -> "Result":
        """A copy whose samples are ``reduce(self.flat())`` put back in place (e.g. the max over ranks)."""
        vals = list(reduce(self.flat()))
        if len(vals) != len(self.flat()):
            raise ValueError(f"reduce returned {len(vals)} values for {len(self.flat())} samples")
        it = iter(vals)
        samples = {n: [[next(it) for _ in steps] for steps in self.samples[n]] for n in self.names}
        return Result(samples, self.orders, dict(self.extra))

    def table(self, baseline: Optional[str] = None, scale: float = 1e3, unit: str = "ms",
              label: Optional[Callable[[str], str]] = None, width: int = 28) -> str:
        """One row per configuration: median [min-max] per step and, with ``baseline``, the within-round ratio
        to it (median [min-max] over rounds)."""
        label = label or (lambda n: n)
        rounds = len(self.orders)
        head = f"{'configuration':<{width}} {unit + '/step median [min-max]':>28}"
        if baseline is not None:
            head += f" {'÷ ' + label(baseline) + ' (per round)':>30}"
        rows = [head]
        for n in self.names:
            row = f"{label(n):<{width}} {self.spread(n).fmt(scale):>28}"
            if baseline is not None:
                row += f" {self.ratio(n, baseline).fmt(1.0, 3):>30}"
            rows.append(row)
        steps = {len(s) for n in self.names for s in self.samples[n]}
        rows.append(f"({rounds} rounds in shuffled order, {'/'.join(map(str, sorted(steps)))} timed step(s) per "
                    f"configuration per round after warm-up; spread = min-max over rounds)")
        return "\n".join(rows)


def measure(steps: Mapping[str, Callable[[], object]], *, rounds: int = 5, steps_per_round: int = 2,
            warmup: int = 1, seed: int = 0, barrier: Callable[[], None] = lambda: None,
            clock: Callable[[], float] = time.perf_counter,
            also: Optional[Mapping[str, Callable[[], float]]] = None,
            on_round: Optional[Callable[[int, list[str]], None]] = None) -> Result:
    """Time each ``steps[name]()`` (one training step) interleaved over ``rounds`` shuffled rounds.

    First every configuration runs ``warmup`` untimed steps (also in a shuffled order). Then in each round
    every configuration runs ``steps_per_round`` timed steps, one configuration after the other, in the round's
    order. ``barrier()`` is called before each timed step (outside the timed span) and must leave the ranks
    lined up; the step's callable must return only when its work is done (synchronise devices inside it).
    ``also``: more clocks read around the same steps (e.g. ``{"cpu": time.process_time}``: this process's CPU
    seconds, robust to other jobs on a shared machine); their samples are ``result.extra[name]`` (Results).
    """
    if steps_per_round < 1:
        raise ValueError(f"steps_per_round={steps_per_round} must be >= 1")
    if warmup < 0:
        raise ValueError(f"warmup={warmup} must be >= 0")
    names = list(steps)
    orders = round_orders(names, rounds + 1, seed)
    warm_order, orders = orders[0], orders[1:]
    for n in warm_order:
        for _ in range(warmup):
            steps[n]()
    also = dict(also or {})
    samples: dict[str, list[list[float]]] = {n: [] for n in names}
    extra: dict[str, dict[str, list[list[float]]]] = {k: {n: [] for n in names} for k in also}
    for r, order in enumerate(orders):
        if on_round is not None:
            on_round(r, order)
        for n in order:
            got: list[float] = []
            got_also: dict[str, list[float]] = {k: [] for k in also}
            for _ in range(steps_per_round):
                barrier()
                a0 = {k: c() for k, c in also.items()}
                t0 = clock()
                steps[n]()
                got.append(clock() - t0)
                for k, c in also.items():
                    got_also[k].append(c() - a0[k])
            samples[n].append(got)
            for k in also:
                extra[k][n].append(got_also[k])
    return Result(samples, orders, {k: Result(v, orders) for k, v in extra.items()})
