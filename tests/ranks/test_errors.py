"""Bad input fails fast and clearly on every rank, before any collective; a lost rank ends in an error, not a hang."""
import subprocess
import sys
import time

import pytest
import torch

import axgrid
from axgrid.testing import RankPool


def rank_bad_init(args: tuple, kwargs: dict) -> str:
    t = time.monotonic()
    try:
        axgrid.init(*args, **kwargs)
    except axgrid.GridError as e:
        return f"{type(e).__name__}: {e} [{time.monotonic() - t:.2f}s]"
    return "no error"


@pytest.mark.parametrize("args,kwargs,msg", [
    (("2x2x2x1",), {}, "has 8 ranks but the world size is 4"),
    ((3,), {}, "Gx\\*Gy\\*Gz=3 does not divide the world size 4"),
    ((2, 0, 1, 2), {}, "gy=0 is invalid"),
    (("2x2x1x1",), {"order": "xyz"}, "must be a permutation of the letters 'xyzd'"),
    ((2, 2), {"gdata": 3}, "has 12 ranks but the world size is 4"),
])
def test_bad_grid_raises_on_every_rank(ranks, args, kwargs, msg):
    import re
    out = ranks(4, rank_bad_init, args, kwargs)
    assert all(re.search(msg, o) for o in out), out


def rank_init_twice() -> str:
    grid = axgrid.init("2x1x1x1", timeout_s=30)
    try:
        axgrid.init("2x1x1x1")
    except axgrid.GridError as e:
        return str(e)
    finally:
        grid.destroy()
    return "no error"


def test_init_twice(ranks):
    assert all("called twice" in m for m in ranks(2, rank_init_twice))


def rank_bad_features() -> str:
    grid = axgrid.init("3x2x1x1", timeout_s=30)
    try:
        msgs = []
        for kwargs in ({"in_features": 10, "out_features": 6}, {"in_features": 6, "out_features": 8,
                                                                  "transpose": True}):
            try:
                axgrid.nn.Linear(**kwargs)
            except ValueError as e:
                msgs.append(str(e))
        layer = axgrid.nn.Linear(6, 6)
        try:
            layer(torch.randn(2, 5))
        except ValueError as e:
            msgs.append(str(e))
        return " | ".join(msgs)
    finally:
        grid.destroy()


def test_bad_features(ranks):
    for m in ranks(6, rank_bad_features):
        assert "in_features=10 is not divisible by Gx=3" in m
        assert "out_features=8 is not divisible by Gx=3" in m and "transposed layer" in m
        assert "input has 5 features, layer expects in_features=6" in m


def rank_lost_collective(timeout_s: float) -> str:
    grid = axgrid.init("3x1x1x1", timeout_s=timeout_s)
    t = time.monotonic()
    try:
        if grid.rank == 2:      # lost: never posts, and keeps its groups open past the others' timeout
            time.sleep(2 * timeout_s + 1)
            return "skipped"
        grid.comm.all_reduce(torch.ones(4), "x")
        return "no error"
    except Exception as e:
        return f"{type(e).__name__} after {time.monotonic() - t:.1f}s: {str(e)[:200]}"
    finally:
        grid.destroy()


@pytest.mark.slow
def test_lost_rank_times_out_instead_of_hanging():
    with RankPool(3, timeout_s=30) as pool:
        out = pool.run(rank_lost_collective, 2.0, deadline_s=60)
    assert out[2] == "skipped"
    for o in out[:2]:
        secs = float(o.split(" after ")[1].split("s:")[0])
        assert o != "no error" and 1.5 <= secs < 20, o


@pytest.mark.slow
def test_launched_job_with_bad_grid_fails_fast():
    """Through the real launcher: every rank raises the clear error and the job exits non-zero, in seconds."""
    t = time.monotonic()
    code = "import axgrid; axgrid.init('3x1x1x1')"
    res = subprocess.run([sys.executable, "-m", "axgrid.cli", "launch", "-n", "2", "--timeout", "120", "--",
                          sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert res.returncode != 0
    assert "grid 3x1x1x1 has 3 ranks but the world size is 2" in res.stdout
    assert time.monotonic() - t < 90


@pytest.mark.parametrize("timeout_s", [0.0, -1.0, float("nan"), float("inf")])
def test_runtime_config_refuses_a_timeout_that_is_not_a_positive_finite_number(timeout_s):
    """``nan <= 0`` is False, so a nan timeout used to pass the check and fail later, far from its cause."""
    with pytest.raises(ValueError, match="timeout_s=.* must be a finite number of seconds > 0"):
        axgrid.RuntimeConfig(timeout_s=timeout_s)
