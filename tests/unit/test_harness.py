"""axgrid.measure.harness: configurations run interleaved in a seeded shuffled order per round, warm-up steps
are not timed, and ratios are taken within a round (a fake clock stands in for time: no timing assertions)."""
import pytest

from axgrid.measure import harness


class FakeClock:
    """Each step advances time by its configuration's cost times the round's slowness factor."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_orders_are_shuffled_seeded_and_complete():
    names = [f"c{i}" for i in range(8)]
    a = harness.round_orders(names, 6, seed=3)
    assert a == harness.round_orders(names, 6, seed=3)          # every rank draws the same orders
    assert a != harness.round_orders(names, 6, seed=4)
    assert all(sorted(o) == sorted(names) for o in a)           # each round runs every configuration once
    assert len({tuple(o) for o in a}) > 1                      # not one fixed order
    with pytest.raises(ValueError, match="distinct"):
        harness.round_orders(["a", "a"], 2, 0)


def test_measure_interleaves_excludes_warmup_and_takes_ratios_within_rounds():
    clock, log, barriers = FakeClock(), [], []
    slow = [1.0]                                   # the machine's slowness in the current round
    cost = {"a": 1.0, "b": 2.0, "c": 4.0}

    def step(name):
        def run():
            log.append(name)
            clock.now += cost[name] * slow[0]
        return run

    def on_round(r, order):
        log.append(("round", r, tuple(order)))
        slow[0] = [1.0, 3.0, 0.5, 10.0][r]        # rounds differ a lot: ratios within a round must not care

    ticks = iter(range(10**6))
    res = harness.measure({n: step(n) for n in cost}, rounds=4, steps_per_round=2, warmup=3, seed=1,
                          barrier=lambda: barriers.append(1), clock=clock, on_round=on_round,
                          also={"ticks": lambda: next(ticks)})
    # warm-up: 3 untimed steps of each configuration before the first round, none timed
    first_round = next(i for i, e in enumerate(log) if isinstance(e, tuple))
    assert sorted(log[:first_round]) == sorted(["a", "b", "c"] * 3)
    # each round runs the configurations one after the other in that round's order, 2 steps each
    rounds = [e for e in log if isinstance(e, tuple)]
    assert [r[2] for r in rounds] == [tuple(o) for o in res.orders]
    for i, (_, r, order) in enumerate(rounds):
        start = log.index(rounds[i]) + 1
        assert log[start:start + 6] == [n for n in order for _ in range(2)]
    assert len(barriers) == 4 * 3 * 2              # one barrier per timed step
    assert res.samples["b"] == [[2.0, 2.0], [6.0, 6.0], [1.0, 1.0], [20.0, 20.0]]
    # ratios within each round are exact although the rounds' speeds differ 20x
    assert res.ratios("c", "a") == [4.0, 4.0, 4.0, 4.0]
    r = res.ratio("b", "a")
    assert (r.median, r.lo, r.hi) == (2.0, 2.0, 2.0)
    s = res.spread("a")
    assert (s.lo, s.hi, s.median) == (0.5, 10.0, 2.0)
    assert res.best() == "a"
    # another clock read around the same timed steps only (one tick per read: 1 per step)
    assert res.extra["ticks"].samples == {n: [[1, 1]] * 4 for n in cost}
    assert "÷ a" in res.table(baseline="a")


def test_reduced_puts_values_back_in_place():
    res = harness.Result({"a": [[1.0, 2.0]], "b": [[3.0, 4.0]]}, [["b", "a"]])
    assert res.flat() == [1.0, 2.0, 3.0, 4.0]
    twice = res.reduced(lambda v: [2 * x for x in v])
    assert twice.samples == {"a": [[2.0, 4.0]], "b": [[6.0, 8.0]]}
    with pytest.raises(ValueError, match="values"):
        res.reduced(lambda v: v[:1])
