"""One grid grammar everywhere: the launcher's preflight, a driver's grid (``grid_shape_for``, what train_gpt,
finetune and ``axgrid.init`` use), perfmodel's ``--grid`` and the dry run's read a spec with
``GridShape.parse`` and so agree on every spec: the same shape, or a refusal with the same reason. (Before, a
three-size grid ``2x2x1`` ran as 2x2x1x1 in train_gpt while perfmodel and the dry run refused it.)"""
import json
import math

import pytest
from hypothesis import given, settings, strategies as st

from axgrid.dryrun.config import DryRunError, resolve
from axgrid.launch.env import LaunchEnv, grid_shape_for
from axgrid.launch.local import preflight
from axgrid.perfmodel.cli import parse_grid
from axgrid.perfmodel.errors import PerfModelError
from axgrid.spec import GridError, GridShape
from axgrid.spec.layout import WorldSizeMismatch

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
        # a well-formed grid of the wrong size: the launcher and perfmodel say so in the terms of their options
        ranks = math.prod(map(int, sizes))
        assert launcher_why.startswith(f"--grid {spec} needs {ranks} ranks but -n is {n}: use -n {ranks}")
        assert priced_why.startswith(f"--grid {spec} has {ranks} ranks, not --gpus {n}: give a grid of {n} ranks")
        return
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


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=3, max_size=4), world=st.one_of(st.none(), st.integers(1, 64)))
def test_the_one_rule_for_the_world_size(sizes, world):
    """Three sizes take Gd from the world size (which must be known, and divisible by Gx*Gy*Gz); four are taken as
    written, and must have the world size's ranks where it is known (WorldSizeMismatch, which callers put in their
    own terms). Every refusal is one line naming the grid."""
    spec = "x".join(map(str, sizes))
    ranks = math.prod(sizes)
    try:
        shape = GridShape.parse(spec, world)
    except GridError as e:
        assert "\n" not in str(e) and spec in str(e)
        if len(sizes) == 3:
            assert not isinstance(e, WorldSizeMismatch)
            assert ("leaves Gdata out" in str(e)) == (world is None)
            assert world is None or world % ranks
        else:
            assert isinstance(e, WorldSizeMismatch) and world is not None and ranks != world
            assert (e.shape, e.world_size) == (GridShape(*sizes), world)
            assert f"choose Gx*Gy*Gz*Gdata = {world}" in str(e)
        return
    assert shape == (GridShape(*sizes, world // ranks) if len(sizes) == 3 else GridShape(*sizes))
    assert world is None or shape.size == world


def test_the_dry_run_puts_a_wrong_number_of_ranks_in_its_terms(tmp_path):
    """Both of the dry run's readers (a named GPT size, a Hugging Face config) take the rule from GridShape.parse:
    three sizes fill Gd from --gpus; four of another number of ranks are refused naming --gpus and the grids that
    fit (perfmodel's reading of --grid against --gpus, and the same line)."""
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256}))
    for model, seq in (("gpt-tiny", None), (str(tmp_path), 16)):
        assert resolve(model, 4, 8, grid="1x2x1", machine="local-4", dtype="fp32", seq=seq).shape == (1, 2, 1, 2)
        with pytest.raises(DryRunError, match=r"^--grid 1x2x2x1 has 4 ranks, not --gpus 8: give a grid of 8 ranks, "
                                              r".*; grids of 8 ranks that fit this model and batch: .*1x2x2x2"):
            resolve(model, 8, 8, grid="1x2x2x1", machine="local-4", dtype="fp32", seq=seq)
