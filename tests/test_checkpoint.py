"""Checkpoints: bit-identical resume, resharding across grids (model and optimizer state), clear errors on damaged
or mismatched checkpoints with the previous one still loadable, and save-on-signal at a step boundary."""
from __future__ import annotations

import os
import signal

import pytest
import torch
from torch import nn

import axgrid
from axgrid.checkpoint import (CheckpointError, CheckpointManager, SaveOnSignal, latest_checkpoint,
                               list_checkpoints, load_checkpoint, save_checkpoint, verify_checkpoint)
from axgrid.models import MLPStack


class Net(nn.Module):
    """Parallel (grid) or serial (grid=None) MLP stack + a dense LayerNorm (a parameter without a tile)."""

    def __init__(self, grid, hidden: int = 12, ffn: int = 18, seed: int = 3) -> None:
        super().__init__()
        self.stack = MLPStack(hidden, 2, ffn=ffn, grid=grid, seed=seed)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.stack(x))

    def layers(self):
        return list(self.stack.ups) + list(self.stack.downs)


def _opt(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def _train(model: Net, opt, grid, gen: torch.Generator, steps: int, hidden: int = 12) -> list[float]:
    """``steps`` AdamW steps on data from ``gen`` and torch's global RNG; returns the (d-mean) losses."""
    gd = grid.size("d") if grid is not None else 1
    d = grid.coord.d if grid is not None else 0
    per = 16 // gd
    losses = []
    for _ in range(steps):
        x = torch.randn(16, hidden, generator=gen) + 0.1 * torch.randn(16, hidden)   # global RNG too
        t = torch.randn(16, hidden, generator=gen)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x[d * per:(d + 1) * per]), t[d * per:(d + 1) * per])
        loss.backward()
        if grid is not None:
            axgrid.sync_gradients(model, grid)
            loss = grid.comm.all_reduce(loss.detach().reshape(1), "d", average=True)[0]
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def _dense(model: Net) -> dict[str, torch.Tensor]:
    """Every dense parameter of the parallel model (collective)."""
    out = {}
    for i, layer in enumerate(model.layers()):
        dense = layer.to_dense()
        out[f"layer{i}.weight"], out[f"layer{i}.bias"] = dense.weight.detach(), dense.bias.detach()
    out["norm.weight"], out["norm.bias"] = model.norm.weight.detach(), model.norm.bias.detach()
    return out


def _serial_state(path: str, hidden: int, ffn: int) -> dict[str, torch.Tensor]:
    """Model and AdamW state of a checkpoint, loaded into the serial model in this process."""
    model = Net(None, hidden, ffn, seed=99)
    opt = _opt(model)
    load_checkpoint(path, model, opt, None, restore_rng=False)
    out = {f"model/{k}": v.clone() for k, v in model.state_dict().items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for p, st in opt.state.items():
        for k, v in st.items():
            out[f"optim/{names[id(p)]}/{k}"] = v.clone()
    return out


# ---------------------------------------------------------------------------------------------------------
# resume: identical losses
# ---------------------------------------------------------------------------------------------------------
def rank_resume(spec: str, root: str) -> dict:
    grid = axgrid.init(spec, timeout_s=60)
    try:
        torch.manual_seed(5)
        model = Net(grid)
        opt = _opt(model)
        gen = torch.Generator().manual_seed(7)
        first = _train(model, opt, grid, gen, 2)
        ckpt = CheckpointManager(root, grid)
        ckpt.save(2, model, opt, extra={"tokens_seen": 32}, generators={"data": gen})
        straight = _train(model, opt, grid, gen, 3)
        # a fresh run: other weights, other RNG states, empty optimizer -> resume -> the same 3 losses
        torch.manual_seed(1234)
        model2 = Net(grid, seed=11)
        opt2 = _opt(model2)
        gen2 = torch.Generator().manual_seed(99)
        info = ckpt.resume(model2, opt2, generators={"data": gen2})
        resumed = _train(model2, opt2, grid, gen2, 3)
        return {"first": first, "straight": straight, "resumed": resumed, "step": info.step, "extra": info.extra,
                "rng": info.rng, "resharded": info.resharded}
    finally:
        grid.destroy()


def test_resume_is_bit_identical(ranks, tmp_path):
    out = ranks(8, rank_resume, "2x1x2x2", str(tmp_path / "ck"))
    for o in out:
        assert o["straight"] == o["resumed"], (o["straight"], o["resumed"])   # bit-identical on CPU
        assert o["step"] == 2 and o["extra"] == {"tokens_seen": 32}
        assert o["rng"] == "per-rank" and not o["resharded"]


def rank_resume_gpt(spec: str, root: str) -> dict:
    from axgrid.models.gpt import GPT, GPTConfig
    grid = axgrid.init(spec, timeout_s=60)
    try:
        cfg = GPTConfig.named("gpt-tiny", layers=1, hidden=32, heads=4, seq=16, vocab=64)

        def steps(model, opt, gen, n):
            losses = []
            for _ in range(n):
                tok = torch.randint(0, cfg.vocab, (4, 17), generator=gen)
                d, per = grid.coord.d, 4 // grid.size("d")
                opt.zero_grad(set_to_none=True)
                loss = model(tok[d * per:(d + 1) * per, :-1], tok[d * per:(d + 1) * per, 1:])
                loss.backward()
                axgrid.sync_gradients(model, grid)
                opt.step()
                losses.append(float(grid.comm.all_reduce(loss.detach().reshape(1), "d", average=True)[0]))
            return losses

        model = GPT(cfg, grid)
        opt = torch.optim.AdamW(model.optimizer_groups(0.1), lr=3e-3)
        gen = torch.Generator().manual_seed(3)
        steps(model, opt, gen, 1)
        save_checkpoint(root, model, opt, grid, step=1, generators={"data": gen})
        straight = steps(model, opt, gen, 2)
        model2 = GPT(GPTConfig.named("gpt-tiny", layers=1, hidden=32, heads=4, seq=16, vocab=64, seed=9), grid)
        opt2 = torch.optim.AdamW(model2.optimizer_groups(0.1), lr=3e-3)
        gen2 = torch.Generator()
        load_checkpoint(root, model2, opt2, grid, generators={"data": gen2})
        probe = torch.randint(0, cfg.vocab, (4, 17), generator=torch.Generator().manual_seed(123))
        d, per = grid.coord.d, 4 // grid.size("d")
        with torch.no_grad():
            p = model2(probe[d * per:(d + 1) * per, :-1], probe[d * per:(d + 1) * per, 1:])
        p = float(grid.comm.all_reduce(p.reshape(1), "d", average=True)[0])
        return {"straight": straight, "resumed": steps(model2, opt2, gen2, 2), "probe": p}
    finally:
        grid.destroy()


def test_resume_gpt_is_bit_identical(ranks, tmp_path):
    pytest.importorskip("axgrid.models.gpt")
    from axgrid.models.gpt import GPT, GPTConfig
    root = str(tmp_path / "gpt")
    out = ranks(8, rank_resume_gpt, "2x2x1x2", root)
    assert all(len(o["straight"]) == 2 and o["straight"] == o["resumed"] for o in out), out[0]
    # the same checkpoint in the serial GPT (reshard to one process) gives the same loss
    serial = GPT(GPTConfig.named("gpt-tiny", layers=1, hidden=32, heads=4, seq=16, vocab=64, seed=5), None)
    load_checkpoint(root, serial, None, None, strict=True, restore_rng=False)
    probe = torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(123))
    with torch.no_grad():
        want = float(serial(probe[:, :-1], probe[:, 1:]))
    assert abs(out[0]["probe"] - want) < 1e-5 * max(1.0, want), (out[0]["probe"], want)


# ---------------------------------------------------------------------------------------------------------
# reshard: 2x2x2x1 -> 4x1x1x2 -> 3x1x2x1 -> 1x1x1x1, and a z-padded pair
# ---------------------------------------------------------------------------------------------------------
def rank_reshard(spec: str, src: str | None, dst: str, hidden: int, ffn: int, train_steps: int) -> dict:
    grid = axgrid.init(spec, timeout_s=60)
    try:
        torch.manual_seed(0)
        model = Net(grid, hidden, ffn, seed=3 if src is None else 8)   # other weights when loading
        opt = _opt(model)
        info = None
        if src is not None:
            info = load_checkpoint(src, model, opt, grid)
        gen = torch.Generator().manual_seed(21)
        losses = _train(model, opt, grid, gen, train_steps, hidden) if train_steps else []
        save_checkpoint(dst, model, opt, grid, step=train_steps)
        dense = _dense(model)                                           # collective: every rank
        return {"dense": dense if grid.rank == 0 else None,
                "losses": losses, "resharded": info.resharded if info else None,
                "rng": info.rng if info else None}
    finally:
        grid.destroy()


def test_reshard_across_grids(ranks, tmp_path):
    h, f = 12, 18
    a, b, c, e = (str(tmp_path / n) for n in "abce")
    run_a = ranks(8, rank_reshard, "2x2x2x1", None, a, h, f, 2)[0]
    run_b = ranks(8, rank_reshard, "4x1x1x2", a, b, h, f, 0)[0]
    run_e = ranks(6, rank_reshard, "3x1x2x1", b, e, h, f, 0)[0]
    run_c = ranks(1, rank_reshard, "1x1x1x1", e, c, h, f, 0)[0]
    assert run_b["resharded"] and run_b["rng"] == "from rank 0"
    for run in (run_b, run_e, run_c):                       # the same dense model on every grid, bit for bit
        for k, v in run_a["dense"].items():
            assert torch.equal(run["dense"][k], v), k
    states = [_serial_state(p, h, f) for p in (a, b, e, c)]   # and the same model + optimizer state
    assert any(k.endswith("/exp_avg_sq") for k in states[0]) and any(k.endswith("/step") for k in states[0])
    for st in states[1:]:
        assert st.keys() == states[0].keys()
        for k in st:
            assert torch.equal(st[k], states[0][k]), k
    assert torch.equal(states[0]["model/stack.ups.0.weight"], run_a["dense"]["layer0.weight"])

    # a resharded run continues as the serial model would from the same checkpoint
    run_d = ranks(8, rank_reshard, "4x1x1x2", a, str(tmp_path / "d"), h, f, 2)[0]
    serial = Net(None, h, f, seed=5)
    opt = _opt(serial)
    load_checkpoint(a, serial, opt, None)          # RNG "from rank 0", as on the resharded grid
    losses = _train(serial, opt, None, torch.Generator().manual_seed(21), 2, h)
    for got, want in zip(run_d["losses"], losses):
        assert abs(got - want) < 1e-5 * max(1.0, abs(want))
    torch.testing.assert_close(run_d["dense"]["layer0.weight"], serial.stack.ups[0].weight.detach(),
                               rtol=1e-4, atol=1e-5)


def test_reshard_with_z_padding(ranks, tmp_path):
    h, f = 12, 9        # 4x1x2x1: blocks of 27 elements split over z=2 -> padded; 1x1x8x1: 108 over 8 -> padded
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    run_a = ranks(8, rank_reshard, "4x1x2x1", None, a, h, f, 1)[0]
    run_b = ranks(8, rank_reshard, "1x1x8x1", a, b, h, f, 0)[0]
    for k, v in run_a["dense"].items():
        assert torch.equal(run_b["dense"][k], v), k
    sa, sb = _serial_state(a, h, f), _serial_state(b, h, f)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


# ---------------------------------------------------------------------------------------------------------
# damaged or mismatched checkpoints
# ---------------------------------------------------------------------------------------------------------
def rank_save_two(root: str) -> list[str]:
    grid = axgrid.init("2x1x1x1", timeout_s=30)
    try:
        model = Net(grid)
        opt = _opt(model)
        _train(model, opt, grid, torch.Generator().manual_seed(0), 1)
        save_checkpoint(root, model, opt, grid, step=1, keep=3)
        _train(model, opt, grid, torch.Generator().manual_seed(1), 1)
        save_checkpoint(root, model, opt, grid, step=2, keep=3)
        # a save that fails on one rank (state this format cannot place) leaves step 2 as the latest
        msg = "no error"
        if grid.rank == 1:
            opt.state[model.norm.weight]["odd"] = torch.zeros(3)
        try:
            save_checkpoint(root, model, opt, grid, step=3, keep=3)
        except CheckpointError as e:
            msg = str(e)
        return [msg, latest_checkpoint(root) or ""]
    finally:
        grid.destroy()


def rank_load(path: str, hidden: int = 12, ffn: int = 18) -> str:
    grid = axgrid.init("2x1x1x1", timeout_s=30)
    try:
        model = Net(grid, hidden, ffn)
        opt = _opt(model)
        try:
            info = load_checkpoint(path, model, opt, grid)
        except CheckpointError as e:
            return "error: " + str(e)
        return f"ok step {info.step}"
    finally:
        grid.destroy()


def test_damaged_checkpoints_fail_clearly(ranks, tmp_path):
    root = str(tmp_path / "ck")
    out = ranks(2, rank_save_two, root)
    assert "could not start saving" in out[0][0] and "neither the parameter's shape" in out[1][0], out
    assert all(o[1].endswith("step-00000002") for o in out)
    assert not any(".tmp-" in n for n in os.listdir(root))          # the failed save left nothing behind
    s1, s2 = list_checkpoints(root)
    verify_checkpoint(s2)
    assert ranks(2, rank_load, root) == ["ok step 2"] * 2

    # truncated file: same error on both ranks (also on the rank that does not read the file), names the file
    victim = os.path.join(s2, "rank-00001.pt")
    data = open(victim, "rb").read()
    with open(victim, "wb") as f:
        f.write(data[: len(data) // 2])
    msgs = ranks(2, rank_load, s2)
    assert all(m.startswith("error:") and "rank-00001.pt" in m and "truncated" in m and s1 in m for m in msgs), msgs
    assert ranks(2, rank_load, s1) == ["ok step 1"] * 2             # the previous checkpoint still loads

    # same size, flipped bytes: the checksum catches it on the rank that reads the file, every rank raises
    with open(victim, "wb") as f:
        f.write(data[:-64] + bytes(64))
    msgs = ranks(2, rank_load, s2)
    assert all(m.startswith("error:") for m in msgs) and any("sha256" in m for m in msgs), msgs
    with pytest.raises(CheckpointError, match="sha256"):
        verify_checkpoint(s2)

    # missing manifest: the step directory and the root (whose `latest` names it) both say so
    os.remove(os.path.join(s2, "manifest.json"))
    for path in (s2, root):
        msgs = ranks(2, rank_load, path)
        assert all(m.startswith("error:") and "incomplete" in m and "step-00000001" in m for m in msgs), msgs

    # other model sizes: names the tensor and both shapes
    msgs = ranks(2, rank_load, s1, 12, 24)
    assert all("dense shape (18, 12)" in m and "(24, 12)" in m for m in msgs), msgs
    assert ranks(2, rank_load, s1) == ["ok step 1"] * 2


# ---------------------------------------------------------------------------------------------------------
# save on signal
# ---------------------------------------------------------------------------------------------------------
def rank_signal(spec: str, root: str) -> dict:
    grid = axgrid.init(spec, timeout_s=30)
    try:
        model = Net(grid)
        opt = _opt(model)
        gen = torch.Generator().manual_seed(0)
        ckpt = CheckpointManager(root, grid)
        stopped_after = None
        with SaveOnSignal(grid) as stop:
            for step in range(10):
                _train(model, opt, grid, gen, 1)
                if step == 3 and grid.rank == 1:
                    os.kill(os.getpid(), signal.SIGUSR1)        # Slurm's pre-timeout signal, to one rank
                if stop.should_stop():
                    ckpt.save(step + 1, model, opt, generators={"data": gen})
                    stopped_after = step + 1
                    break
        handler_restored = signal.getsignal(signal.SIGUSR1) is not stop._handler
        info = CheckpointManager(root, grid).resume(Net(grid), None)
        return {"stopped_after": stopped_after, "signal": stop.signal_name, "resumed_step": info.step,
                "restored": handler_restored}
    finally:
        grid.destroy()


def test_save_on_signal(ranks, tmp_path):
    out = ranks(4, rank_signal, "2x1x1x2", str(tmp_path / "sig"))
    assert [o["stopped_after"] for o in out] == [4] * 4
    assert [o["signal"] for o in out] == [None, "SIGUSR1", None, None]
    assert all(o["resumed_step"] == 4 and o["restored"] for o in out)
