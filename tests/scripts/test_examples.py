"""The runnable examples of examples/ on real gloo ranks: the tour and "your own model" train exactly as the same
model trained serially on the whole batch (micro-batches averaged, data-parallel shares of the batch); the Hugging
Face example loads a tiny local save_pretrained checkpoint, trains, generates from one prompt and exports."""
import pytest
import torch
from torch import nn

from helpers import load_example

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
