"""The runnable examples of examples/ on real gloo ranks: the tour and "your own model" train exactly as the same
model trained serially on the whole batch (micro-batches averaged, data-parallel shares of the batch); the Hugging
Face example loads a tiny local save_pretrained checkpoint, trains, generates from one prompt and exports; the
Lightning Fabric example (AxgridStrategy) trains as serial training and as axgrid's own loop, reads every step's
batch over d only, resumes from fabric.save on another grid, and under bf16-mixed and bf16-true trains as axgrid's own
loop under the same precision."""
import contextlib
import os

import pytest
import torch
from torch import nn

import axgrid

from helpers import load_example
from helpers.fabric_serial import serial_fabric_losses

TOUR_STEPS = 3


def rank_example(name: str, argv: list) -> dict:
    return load_example(name).main(argv)


def serial_tour() -> tuple[list, dict]:
    """The tour's model, data and steps in one process on the whole batch (micro-batches: none)."""
    torch.manual_seed(0)
    torch.randn(16, 64)                                         # the tour's layer input
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(1)
    x, t = torch.randn(32, 64, generator=gen), torch.randn(32, 64, generator=gen)
    losses = []
    for step in range(1 + TOUR_STEPS):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), t)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses[1:], model.state_dict()


def test_the_tour_trains_with_the_whole_batchs_mean_gradient(ranks):
    want_losses, want_weights = serial_tour()
    for got in ranks(4, rank_example, "tour.py", ["--grid", "1x2x1x2", "--steps", str(TOUR_STEPS)]):
        assert got["layer_out"] == (16, 256)
        assert got["losses"] == pytest.approx(want_losses, rel=1e-4)
        for name, w in want_weights.items():
            torch.testing.assert_close(got["weights"][name], w, rtol=1e-4, atol=1e-5)


def test_your_own_model_parallelized_trains_as_serially(ranks):
    mod = load_example("own_model.py")
    from axgrid.data import DEFAULT_TEXT, TextBatches
    model, data = mod.TinyLM(), TextBatches(DEFAULT_TEXT, 32, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    want = []
    for step in range(6):
        inputs, targets = data.batch(step, 8)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        want.append(loss.item())
    for got in ranks(4, rank_example, "own_model.py", ["--grid", "2x1x1x2", "--steps", "6", "--seq", "32"]):
        assert got["losses"] == pytest.approx(want, rel=1e-4)
    assert want[-1] < want[0] - 0.5                             # it learns the bytes of the text


def test_fine_tune_a_tiny_hugging_face_checkpoint(ranks, tmp_path):
    pytest.importorskip("transformers")
    mod = load_example("finetune_hf.py")
    mod.main(["--make-tiny", str(tmp_path / "tiny")])
    argv = ["--checkpoint", str(tmp_path / "tiny"), "--grid", "1x2x1x2", "--steps", "4", "--seq", "32",
            "--export", str(tmp_path / "ft")]
    outs = ranks(4, rank_example, "finetune_hf.py", argv)
    losses = outs[0]["losses"]
    assert all(o["losses"] == losses for o in outs) and losses[-1] < losses[0]
    assert all(torch.equal(o["tokens"], outs[0]["tokens"]) and o["tokens"].shape == (1, 16 + 16) for o in outs)
    from transformers import LlamaForCausalLM
    LlamaForCausalLM.from_pretrained(tmp_path / "ft")          # the export is a Hugging Face folder


# -- Lightning Fabric (examples/fabric_train.py): the Fabric loop on AxgridStrategy ------------------------------
FABRIC_STEPS, FABRIC_BATCH, FABRIC_SEQ = 4, 8, 16


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def rank_axgrid_loop(spec: str, zero: int, accum: int, precision: str = "32-true") -> list[float]:
    """The same training with axgrid's own loop: parallelize, shard_optimizer, train_step; under ``precision`` as
    users write it without Fabric: bf16-mixed, the forward under ``torch.autocast`` in bf16; bf16-true, the model in
    bf16 (``.to(torch.bfloat16)``) and its forward with bf16 as the default dtype. Each d-rank reads the rows
    Fabric's DistributedSampler deals it (rows d, d + Gd, ... of every step's batch); ``axgrid.local_batch``'s
    contiguous block gives the same fp32 losses (to 1e-7), but under bf16 each rank's partial gradient sums round
    differently (Fabric against this loop with it, grid 2x1x1x2: up to 5e-5 relative apart in bf16-mixed, 7e-5 in
    bf16-true; bf16 is 2e-4 and 7e-4 from fp32 there)."""
    mod = load_example("fabric_train.py")
    ov = axgrid.OverlapConfig.parse("all")
    grid = axgrid.init(spec, config=axgrid.RuntimeConfig(timeout_s=120, seed=0, zero=zero, overlap=ov))
    forward = {"32-true": contextlib.nullcontext, "bf16-mixed": lambda: torch.autocast("cpu", torch.bfloat16),
               "bf16-true": lambda: default_dtype(torch.bfloat16)}[precision]
    try:
        model = mod.make_model()
        model = axgrid.parallelize(model.to(torch.bfloat16) if precision == "bf16-true" else model, grid)
        opt = axgrid.shard_optimizer(torch.optim.AdamW(model.parameters(), lr=3e-3), model, grid)
        windows = mod.byte_windows(FABRIC_STEPS * FABRIC_BATCH, FABRIC_SEQ)
        d, gd = grid.index("d"), grid.size("d")

        def loss(i: int) -> torch.Tensor:
            with forward():
                return model(input_ids=xs[i], labels=ys[i], shift_labels=ys[i]).loss.float()

        losses = []
        for step in range(FABRIC_STEPS):
            mine = windows[step * FABRIC_BATCH:(step + 1) * FABRIC_BATCH][d::gd].chunk(accum)
            xs, ys = [m[:, :-1] for m in mine], [m[:, 1:].contiguous() for m in mine]
            out = axgrid.train_step(model, opt, loss, grid, microbatches=accum, clip=1.0)
            losses.append(float(grid.comm.all_reduce(out.loss.reshape(1), "d", average=True)[0]))
        return losses
    finally:
        grid.destroy()


def rank_fabric_example(argv: list) -> dict:
    """The example on this rank, the rank's environment restored after it (Fabric's teardown removes WORLD_SIZE,
    which the next test on this pool rank reads)."""
    saved = dict(os.environ)
    try:
        return load_example("fabric_train.py").main(argv)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def fabric_argv(spec: str, zero: int, accum: int, *more: str) -> list[str]:
    return ["--grid", spec, "--zero", str(zero), "--accum", str(accum), "--steps", str(FABRIC_STEPS),
            "--batch", str(FABRIC_BATCH), "--seq", str(FABRIC_SEQ), *more]


def test_fabric_loop_trains_as_axgrid_loop_and_serially(ranks):
    """Grid 1x1x2x2 (sequences split over z inside each d-group), zero=1, every overlap, two micro-batches under
    fabric.no_backward_sync, fabric.clip_gradients: the losses of serial training and of axgrid's own loop; and the
    sampler gives the ranks of one d-group the same rows, each d-group its own half of every step's batch."""
    pytest.importorskip("lightning_fabric")
    spec, zero, accum = "1x1x2x2", 1, 2
    want = serial_fabric_losses(FABRIC_STEPS, FABRIC_BATCH, FABRIC_SEQ)
    plain = ranks(4, rank_axgrid_loop, spec, zero, accum)
    outs = ranks(4, rank_fabric_example, fabric_argv(spec, zero, accum))
    for got, mine in zip(outs, plain):
        assert got["losses"] == pytest.approx(want, rel=1e-4) and mine == pytest.approx(want, rel=1e-4)
        assert got["losses"] == pytest.approx(mine, rel=1e-5)
    for step in range(FABRIC_STEPS):
        by_d: dict = {}
        for got in outs:
            by_d.setdefault(got["coord"][3], set()).add(tuple(got["rows"][step]))
        assert all(len(rows) == 1 for rows in by_d.values()), by_d       # the same rows across x, y, z
        halves = [set(next(iter(rows))) for rows in by_d.values()]
        assert len(halves) == 2 and not halves[0] & halves[1]
        assert halves[0] | halves[1] == set(range(step * FABRIC_BATCH, (step + 1) * FABRIC_BATCH))
    assert want[-1] < want[0]


def test_fabric_save_and_load_resume_to_the_same_losses_on_another_grid(ranks, tmp_path):
    """fabric.save after step 2 on 2x1x1x2 (zero=1); fabric.load on 1x2x1x2 (zero=2) resumes: steps 3 and 4 lose
    what the unbroken run lost (the checkpoint reshards: another grid, another zero mode)."""
    pytest.importorskip("lightning_fabric")
    ck = str(tmp_path / "ck")
    whole = ranks(4, rank_fabric_example, fabric_argv("2x1x1x2", 1, 1, "--save", ck, "--save-at", "2"))
    resumed = ranks(4, rank_fabric_example, fabric_argv("1x2x1x2", 2, 1, "--resume", ck))
    for got in resumed:
        assert got["start"] == 2 and got["losses"] == pytest.approx(whole[0]["losses"][2:], rel=1e-4), got


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_fabric_loop_in_bf16_trains_as_axgrid_loop_in_bf16(ranks, precision):
    """Fabric's precision plugin (bf16-mixed: autocast; bf16-true: the model converted to bf16) on grid 2x1x1x2
    (every layer split over x), two micro-batches: the losses of axgrid's own loop under the same precision; and
    they are bf16's (not fp32's: the precision took effect), within bf16's rounding of serial fp32 training."""
    pytest.importorskip("lightning_fabric")
    spec, zero, accum = "2x1x1x2", 1, 2
    fp32 = serial_fabric_losses(FABRIC_STEPS, FABRIC_BATCH, FABRIC_SEQ)
    plain = ranks(4, rank_axgrid_loop, spec, zero, accum, precision)
    outs = ranks(4, rank_fabric_example, fabric_argv(spec, zero, accum, "--precision", precision))
    for got, mine in zip(outs, plain):
        assert got["losses"] == pytest.approx(mine, rel=1e-5), (got["losses"], mine)
    losses = outs[0]["losses"]
    assert losses == pytest.approx(fp32, rel=2e-3), (losses, fp32)
    assert max(abs(a - b) for a, b in zip(losses, fp32)) > 1e-5, (losses, fp32)
