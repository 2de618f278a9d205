"""One grid grammar everywhere: the launcher's preflight, a driver's grid (``grid_shape_for``, what train_gpt,
finetune and ``axgrid.init`` use), perfmodel's ``--grid`` and the dry run's read a spec with
``GridShape.parse`` and so agree on every spec: the same shape, or a refusal with the same reason. (Before, a
three-size grid ``2x2x1`` ran as 2x2x1x1 in train_gpt while perfmodel and the dry run refused it.)"""
import pytest
from hypothesis import given, settings, strategies as st

from axgrid.dryrun.config import DryRunError, resolve
from axgrid.launch.env import LaunchEnv, grid_shape_for
from axgrid.launch.local import preflight
from axgrid.perfmodel.cli import parse_grid
from axgrid.perfmodel.errors import PerfModelError
from axgrid.spec import GridError, GridShape

SIZE = st.one_of(st.integers(0, 5).map(str), st.sampled_from(["", "-1", "a", " 2", "1.5"]))


def _verdict(fn):
    try:
        return fn(), None
    except (GridError, PerfModelError, DryRunError) as e:
        return None, str(e)


def job(n: int) -> LaunchEnv:
    return LaunchEnv(rank=0, world_size=n, local_rank=0, local_world_size=n, master_addr="127.0.0.1",
                     master_port=29500, launcher="torchrun")


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(SIZE, min_size=1, max_size=5), sep=st.sampled_from(["x", "X", "×"]), n=st.integers(1, 16))
def test_every_reader_of_a_grid_agrees(sizes, sep, n):
    spec = sep.join(sizes)
    want, why = _verdict(lambda: GridShape.parse(spec, n))
    driver, driver_why = _verdict(lambda: grid_shape_for(spec, job(n)))
    launcher, launcher_why = _verdict(lambda: preflight(n, ["python", "-c", "pass", "--grid", spec]))
    priced, priced_why = _verdict(lambda: parse_grid(spec, n))
    assert driver == want and driver_why == why and (launcher_why is None) == (want is not None)
    if why is not None and len(sizes) == 4 and "ranks but the world size" in why:
        return          # a well-formed grid of the wrong size: the launcher ("-n is N") and perfmodel ("not --gpus
        #                 N", once priced) say so in their own terms
    assert (priced is None) == (want is None)
    if want is not None:
        assert priced == want.as_tuple()
    else:
        assert priced_why == launcher_why == f"--grid {spec}: {why}"

@pytest.mark.parametrize("spec", ["2x2x1", "2x2x1x1"])
def test_a_three_size_grid_means_the_same_to_a_driver_the_launcher_perfmodel_and_the_dry_run(spec):
    assert grid_shape_for(spec, job(4)) == GridShape(2, 2, 1, 1)
    preflight(4, ["python", "-c", "pass", "--grid", spec])
    assert parse_grid(spec, 4) == (2, 2, 1, 1)
    assert resolve("gpt-tiny", 4, 8, grid=spec, machine="local-4", dtype="fp32").shape == (2, 2, 1, 1)
    with pytest.raises(DryRunError, match="leaves Gdata out, so the world size is needed"):
        resolve("gpt-tiny", None, 8, grid="2x2x1", machine="local-4", dtype="fp32")
