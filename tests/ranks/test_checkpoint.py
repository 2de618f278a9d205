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
from axgrid.spec import TransformerShape


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


@pytest.mark.slow
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
                tok = torch.randint(0, cfg.shape.vocab, (4, 17), generator=gen)
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
        probe = torch.randint(0, cfg.shape.vocab, (4, 17), generator=torch.Generator().manual_seed(123))
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


@pytest.mark.slow
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


def _own_bytes(model: nn.Module, opt) -> int:
    """Tensor bytes this rank keeps of the model and its AdamW state: each parameter's real elements (a split
    part's padding excluded) for the weight, exp_avg and exp_avg_sq, plus every parameter's scalar step."""
    n = 0
    for p in model.parameters():
        tile = getattr(p, "axgrid_tile", None)
        start, stop = tile.part_range() if tile is not None else (0, p.numel())
        n += 3 * (stop - start) * p.element_size() + opt.state[p]["step"].element_size()
    return n


def rank_reads_onto_another_grid(save_spec: str, load_spec: str, root: str, hidden: int, ffn: int) -> dict:
    grid = axgrid.init(save_spec, timeout_s=60)
    try:
        model = Net(grid, hidden, ffn)
        opt = _opt(model)
        _train(model, opt, grid, torch.Generator().manual_seed(0), 1, hidden)
        path = save_checkpoint(root, model, opt, grid, step=1)
        wrote_max = _own_bytes(model, opt)
    finally:
        grid.destroy()
    grid = axgrid.init(load_spec, timeout_s=60)
    try:
        model = Net(grid, hidden, ffn, seed=8)
        opt = _opt(model)
        _train(model, opt, grid, torch.Generator().manual_seed(1), 1, hidden)     # optimizer state exists
        info = load_checkpoint(path, model, opt, grid)
        return {"read": info.bytes_read, "own": _own_bytes(model, opt), "wrote_max": wrote_max,
                "resharded": info.resharded}
    finally:
        grid.destroy()


def test_loading_onto_another_grid_reads_exactly_the_ranks_own_parts(ranks, tmp_path):
    """The bound, counted: each rank reads only the boxes of its own parts (z-split weights, padded parts, the
    dense LayerNorm read whole), and no rank writes more than it holds."""
    import json
    root = str(tmp_path / "ck")
    out = ranks(4, rank_reads_onto_another_grid, "1x2x2x1", "1x1x4x1", root, 9, 18)   # z-padded blocks
    assert all(o["resharded"] and o["read"] == o["own"] for o in out), out
    man = json.load(open(os.path.join(latest_checkpoint(root), "manifest.json")))
    wrote = {}
    for info in man["tensors"].values():
        for t in info["tiles"]:
            size = 8 if info["dtype"] == "float64" else 4
            wrote[t["file"]] = wrote.get(t["file"], 0) + size * max(1, int(torch.tensor(t["shape"]).prod()))
    assert all(wrote.get(f"rank-{r:05d}.pt", 0) <= out[r]["wrote_max"] for r in range(4)), (wrote, out)
    assert len(wrote) == 4                                   # every rank wrote its own z-part: no gather


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


# ---------------------------------------------------------------------------------------------------------
# run config: resume refuses a checkpoint saved by a run with other settings
# ---------------------------------------------------------------------------------------------------------
def rank_config(root: str) -> list[str]:
    from dataclasses import asdict

    from axgrid.checkpoint import ConfigMismatch
    from axgrid.models.gpt import GPT, GPTConfig
    grid = axgrid.init("2x1x1x1", timeout_s=30)
    try:
        def run(heads: int, seed: int = 0, steps: int = 10) -> tuple[GPT, dict]:
            cfg = GPTConfig(TransformerShape("test", layers=1, hidden=16, heads=heads, seq=8, vocab=32))
            return GPT(cfg, grid), {"model": asdict(cfg), "seed": seed, "data": "synthetic", "steps": steps}

        model, config = run(heads=2)
        save_checkpoint(root, model, None, grid, step=1, config=config)
        out = []
        for heads, seed, steps, allow in ((4, 0, 10, ()), (4, 1, 20, ()), (2, 0, 20, ("steps",)),
                                          (4, 0, 10, ("model",))):
            other, cfg = run(heads, seed, steps)
            try:
                info = load_checkpoint(root, other, None, grid, config=cfg, allow_changes=allow)
                out.append(f"ok {info.config['model.shape.heads']} {info.config['steps']}")
            except ConfigMismatch as e:
                out.append(f"{sorted(e.fields)}: {e}")
        return out
    finally:
        grid.destroy()


def test_resume_compares_run_config(ranks, tmp_path):
    out = ranks(2, rank_config, str(tmp_path / "ck"))
    assert out[0] == out[1]
    heads, three, steps_ok, model_ok = out[0]
    # 2 and 4 heads have the same weight shapes: only the recorded config (the shape's heads, and the head size and
    # key-value heads that follow from them) tells them apart
    changed = "['model.shape.head_dim', 'model.shape.heads', 'model.shape.kv_heads'"
    assert heads.startswith(changed + "]") and "model.shape.heads 2 -> 4" in heads and "allow_changes" in heads
    assert three.startswith(changed + ", 'seed', 'steps']") and "seed 0 -> 1" in three
    assert "steps 10 -> 20" in three and "step-00000001" in three
    assert steps_ok == "ok 2 10" and model_ok == "ok 2 10"


def test_config_values_that_could_never_match_on_resume(tmp_path):
    """Review fix: a config value whose text holds a memory address (a function, a plain object) was saved as
    its repr and made every resume fail with ConfigMismatch; a NaN (e.g. an unset clip) never compared equal."""
    root = str(tmp_path / "ck")
    model = Net(None)
    with pytest.raises(CheckpointError, match=r"config field model\.act is <function .*memory address"):
        save_checkpoint(root, model, None, None, step=1, config={"model": {"act": lambda x: x}})
    assert not os.path.exists(os.path.join(root, "step-00000001"))
    config = {"clip": float("nan"), "betas": (0.9, float("nan")), "note": "kept at 0x10 as text"}
    save_checkpoint(root, model, None, None, step=1, config=config)
    info = load_checkpoint(root, Net(None), None, None, config=config, restore_rng=False)
    assert info.step == 1 and info.config["note"] == "kept at 0x10 as text"


def _train_gpt_module():
    from helpers import load_script
    return load_script("train/train_gpt.py")


def rank_train_gpt_resume(root: str) -> list[str]:
    main = _train_gpt_module().main
    common = ["--model", "gpt-tiny", "--layers", "1", "--hidden", "16", "--heads", "2", "--seq", "8", "--batch", "2",
              "--no-progress", "--grid", "1x1x1x1", "--save", root]
    out = [str(len(main(common + ["--steps", "2"])["losses"]))]
    for extra in (["--steps", "3", "--heads", "4"], ["--steps", "3"]):
        try:
            main(common + extra + ["--resume", root])
            out.append("no error")
        except SystemExit as e:
            out.append(str(e))
    out.append(str(len(main(common + ["--steps", "3", "--resume", root, "--allow-config-change", "steps"])["losses"])))
    return out


def test_train_gpt_resume_refuses_other_settings(ranks, tmp_path):
    first, heads, steps, resumed = ranks(1, rank_train_gpt_resume, str(tmp_path / "ck"))[0]
    assert first == "2" and resumed == "1"
    assert "model.heads 2 -> 4" in heads and "--allow-config-change model.heads,steps" in heads, heads
    assert "steps 2 -> 3" in steps and "--allow-config-change steps" in steps and "heads" not in steps, steps


# ---------------------------------------------------------------------------------------------------------
# a save that dies between its renames, names that lead outside, bad manifest fields, leftovers
# ---------------------------------------------------------------------------------------------------------
class _OsFailingAt:
    """Stands in for the ``os`` module inside axgrid.checkpoint.save: its ``k``-th rename/replace raises an
    OSError, or (``die``) ends the process on the spot, instead of running."""

    def __init__(self, k: int, die: bool = False) -> None:
        self.k, self.die, self.calls = k, die, 0

    def __getattr__(self, name: str):
        return getattr(os, name)

    def _step(self) -> None:
        self.calls += 1
        if self.calls == self.k:
            if self.die:
                os._exit(9)
            raise OSError(f"injected failure at rename {self.k}")

    def rename(self, *a):
        self._step()
        return os.rename(*a)

    def replace(self, *a):
        self._step()
        return os.replace(*a)


def _local(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def rank_resave_crash(root: str, die_at: int) -> list[str]:
    """Re-save step 2 while the k-th rename of rank 0 fails (k = 1, 2, ...): after each attempt ``latest`` and
    the loader name the same complete step 2, holding either the old or the new weights, and nothing is left."""
    import axgrid.checkpoint.save as save_mod
    grid = axgrid.init("2x1x1x1", timeout_s=30)
    try:
        model = Net(grid)
        opt = _opt(model)
        gen = torch.Generator().manual_seed(0)
        for step in (1, 2):
            _train(model, opt, grid, gen, 1)
            save_checkpoint(root, model, opt, grid, step=step, keep=None)
        committed, log, want = _local(model), [], os.path.join(root, "step-00000002")
        for k in range(1, 12):
            _train(model, opt, grid, gen, 1)
            if grid.rank == 0:
                save_mod.os = _OsFailingAt(die_at if die_at else k, die=bool(die_at))
            try:
                save_checkpoint(root, model, opt, grid, step=2, keep=None)
                outcome = "saved"
            except CheckpointError as e:
                outcome = "failed" if "injected failure" in str(e) or "rank 0 failed" in str(e) else str(e)
            finally:
                save_mod.os = os
            assert latest_checkpoint(root) == want, (k, latest_checkpoint(root))
            fresh = Net(grid, seed=11)
            info = load_checkpoint(root, fresh, _opt(fresh), grid)
            got = _local(fresh)
            new = _local(model)
            same_old = all(torch.equal(got[n], committed[n]) for n in got)
            same_new = all(torch.equal(got[n], new[n]) for n in got)
            assert info.path == want and (same_new if outcome == "saved" else same_old or same_new), (k, outcome)
            committed = got
            leftovers = sorted(n for n in os.listdir(root) if ".tmp-" in n or ".old-" in n)
            in_step = set(os.listdir(want)) - {"manifest.json"} - set(verify_checkpoint(want)["files"])
            log.append(f"{k}:{outcome}:{'old' if same_old else 'new'}:{leftovers}:{sorted(in_step)}")
            if outcome == "saved":
                break
        return log
    finally:
        grid.destroy()


def test_resave_never_leaves_latest_dangling(ranks, tmp_path):
    root = str(tmp_path / "ck")
    log = ranks(2, rank_resave_crash, root, 0)
    assert log[0] == log[1] and log[0][-1].split(":")[1] == "saved" and len(log[0]) >= 3, log
    assert all(entry.endswith(":[]:[]") for entry in log[0]), log[0]       # failed saves cleaned up after themselves
    assert any(":failed:old:" in e for e in log[0]), log[0]


def rank_leftovers(root: str) -> list[str]:
    import axgrid.checkpoint.save as save_mod
    grid = axgrid.init("2x1x1x1", timeout_s=30)
    try:
        model = Net(grid)
        save_checkpoint(root, model, None, grid, step=1)
        if grid.rank == 0:                       # what saves killed on the way leave behind
            os.makedirs(os.path.join(root, "step-00000002.tmp-00deadbeef"))
            open(os.path.join(root, "step-00000002.tmp-00deadbeef", "rank-00000.pt"), "wb").close()
            open(os.path.join(root, "latest.tmp-00deadbeef"), "w").close()
            open(os.path.join(root, "step-00000001", "rank-00001.00deadbeef.pt"), "wb").close()
        save_checkpoint(root, model, None, grid, step=2)
        listing = [sorted(os.listdir(root)), sorted(os.listdir(os.path.join(root, "step-00000001")))]
        real_write = save_mod._write_bytes

        def failing_write(path, data):              # not an OSError: still every rank must learn of it
            raise RuntimeError("simulated pickling failure")
        if grid.rank == 1:
            save_mod._write_bytes = failing_write
        try:
            save_checkpoint(root, model, None, grid, step=3)
            msg = "no error"
        except CheckpointError as e:
            msg = str(e)
        finally:
            save_mod._write_bytes = real_write
        return listing + [sorted(os.listdir(root)), [msg]]
    finally:
        grid.destroy()


def test_failed_and_killed_saves_leave_nothing(ranks, tmp_path):
    out = ranks(2, rank_leftovers, str(tmp_path / "ck"))
    root_after, step1, root_failed, (msg,) = out[1]
    assert root_after == root_failed == ["latest", "step-00000001", "step-00000002"], out[1]
    assert step1 == ["manifest.json", "rank-00000.pt", "rank-00001.pt"], step1
    assert "simulated pickling failure" in msg and out[0][3][0].startswith("1 rank(s) failed writing"), out


@pytest.fixture(scope="module")
def saved(ranks, tmp_path_factory):
    """A small checkpoint (2 gloo ranks, steps 1 and 2) to copy and damage."""
    root = str(tmp_path_factory.mktemp("saved") / "ck")
    assert ranks(2, rank_save_two, root)[0][1].endswith("step-00000002")
    return root


def _copy(saved: str, tmp_path) -> str:
    import shutil
    root = str(tmp_path / "ck")
    shutil.copytree(saved, root, symlinks=True)
    return root


def _serial_load(path: str) -> str:
    model = Net(None)
    try:
        return f"ok {load_checkpoint(path, model, _opt(model), None, restore_rng=False).step}"
    except CheckpointError as e:
        return f"error: {e}"


def test_names_leading_outside_are_refused(saved, tmp_path):
    import json
    import shutil
    root = _copy(saved, tmp_path)
    outside = str(tmp_path / "outside")
    shutil.copytree(os.path.join(root, "step-00000001"), os.path.join(outside, "step-00000001"))
    pointer = os.path.join(root, "latest")
    for name in ("../outside/step-00000001", os.path.join(outside, "step-00000001"), "step-00000001/../.."):
        open(pointer, "w").write(name + "\n")
        with pytest.raises(CheckpointError, match="not a checkpoint folder of this root") as e:
            latest_checkpoint(root)
        assert _serial_load(root) == f"error: {e.value}"            # one resolver: the loader says the same
    os.symlink(os.path.join(outside, "step-00000001"), os.path.join(root, "step-00000009"))
    open(pointer, "w").write("step-00000009\n")
    with pytest.raises(CheckpointError, match="outside"):
        latest_checkpoint(root)
    assert _serial_load(root).startswith("error:") and "outside" in _serial_load(root)
    os.remove(pointer)
    assert latest_checkpoint(root).endswith("step-00000002")         # the link is no checkpoint of this root

    # a manifest naming files outside its folder; a rank file that is a link to one
    s2 = os.path.join(root, "step-00000002")
    mpath = os.path.join(s2, "manifest.json")
    good = json.load(open(mpath))
    for bad in ("../step-00000001/rank-00000.pt", os.path.join(outside, "step-00000001", "rank-00000.pt")):
        man = json.loads(json.dumps(good).replace('"rank-00000.pt"', json.dumps(bad)))
        json.dump(man, open(mpath, "w"))
        msg = _serial_load(s2)
        assert "not a plain file name inside the checkpoint folder" in msg and bad in msg, msg
    json.dump(good, open(mpath, "w"))
    assert _serial_load(s2) == "ok 2"
    os.remove(os.path.join(s2, "rank-00000.pt"))
    os.symlink(os.path.join(saved, "step-00000002", "rank-00000.pt"), os.path.join(s2, "rank-00000.pt"))
    msg = _serial_load(s2)
    assert "rank-00000.pt is a link to" in msg and "outside the checkpoint folder" in msg, msg


@pytest.mark.parametrize("edit,field", [
    (lambda m: m.pop("world_size"), "field world_size must be an integer >= 1, found nothing"),
    (lambda m: m.update(step="2"), "field step must be an integer >= 0, found '2'"),
    (lambda m: next(iter(m["files"].values())).update(bytes=None), "bytes must be an integer"),
    (lambda m: next(iter(m["tensors"].values()))["tiles"][0].pop("offsets"), "tiles[0].offsets must be a list"),
    (lambda m: next(iter(m["tensors"].values())).update(dtype="float99"), "dtype must be a torch dtype name"),
    (lambda m: m["optimizer"].pop("state_keys"), "field optimizer.state_keys must be"),
])
def test_bad_manifest_fields_are_named(saved, tmp_path, edit, field):
    import json
    root = _copy(saved, tmp_path)
    mpath = os.path.join(root, "step-00000002", "manifest.json")
    man = json.load(open(mpath))
    edit(man)
    json.dump(man, open(mpath, "w"))
    msg = _serial_load(root)
    assert msg.startswith("error:") and field in msg and "step-00000001" in msg, msg
    with pytest.raises(CheckpointError, match="manifest is damaged"):
        verify_checkpoint(root)


def test_bad_manifest_field_fails_on_every_rank(ranks, saved, tmp_path):
    import json
    root = _copy(saved, tmp_path)
    mpath = os.path.join(root, "step-00000002", "manifest.json")
    man = json.load(open(mpath))
    del man["tensors"]["model/norm.weight"]["kind"]
    json.dump(man, open(mpath, "w"))
    msgs = ranks(2, rank_load, root)
    assert all("field tensors['model/norm.weight'].kind must be one of" in m for m in msgs), msgs


def test_rank_killed_during_resave(ranks, tmp_path):
    """Real process death of rank 0 between the renames of a re-save (last here: it costs the pool a restart)."""
    from axgrid.testing import RankFailure
    root = str(tmp_path / "killed")
    with pytest.raises(RankFailure, match="rank 0 died"):
        ranks(2, rank_resave_crash, root, 2)
    step2 = os.path.join(root, "step-00000002")
    assert latest_checkpoint(root) == step2
    model = Net(None, seed=11)
    assert load_checkpoint(root, model, _opt(model), None, restore_rng=False).path == step2


def test_optimizer_state_is_read_into_the_state_it_already_has(tmp_path):
    """Loading into an optimizer that has state overwrites its state tensors in place (no second copy) with
    the saved values, and training goes on as from the save."""
    torch.manual_seed(5)
    model, gen = Net(None), torch.Generator().manual_seed(7)
    opt = _opt(model)
    _train(model, opt, None, gen, 2)
    path = save_checkpoint(str(tmp_path / "ck"), model, opt, step=2, generators={"data": gen})
    straight = _train(model, opt, None, gen, 2)
    model2, gen2 = Net(None, seed=11), torch.Generator().manual_seed(99)
    opt2 = _opt(model2)
    _train(model2, opt2, None, gen2, 1)                 # state of its own, which the load must overwrite
    storages = {(id(p), k): v.data_ptr() for p, st in opt2.state.items() for k, v in st.items() if v.dim()}
    load_checkpoint(path, model2, opt2, generators={"data": gen2})
    assert storages == {(id(p), k): v.data_ptr() for p, st in opt2.state.items() for k, v in st.items() if v.dim()}
    assert _train(model2, opt2, None, gen2, 2) == straight


def test_optimizer_state_is_staged_on_the_parameters_device(tmp_path):
    """The state an optimizer does not have yet is created where its parameter lives (on a GPU: not in host memory,
    then copied); the meta device stands in for a device that is not the CPU."""
    from axgrid.checkpoint.load import _Reader, _read_manifest, _stage_optimizer
    model = Net(None)
    opt = _opt(model)
    _train(model, opt, None, torch.Generator().manual_seed(7), 1)
    path = save_checkpoint(str(tmp_path / "ck"), model, opt, step=1)
    elsewhere = Net(None).to("meta")
    _, pending = _stage_optimizer(_Reader(path, _read_manifest(path), False), elsewhere, _opt(elsewhere), None, path)
    staged = [e.tensor for _, _, e, _ in pending if e is not None]
    assert staged and {t.device.type for t in staged} == {"meta"}


def rank_slow_writer(root: str, delay_s: float) -> str:
    """A checkpoint whose writer (d = 0) takes ``delay_s`` longer than the 2 s collective timeout to hash its file,
    while the d = 1 rank waits in the agreement: the agreement's limit is io_timeout_s."""
    import time
    from axgrid.checkpoint import save as save_mod
    grid = axgrid.init("1x1x1x2", config=axgrid.RuntimeConfig(timeout_s=2.0, io_timeout_s=60.0, seed=0))
    original = save_mod._sha256_file
    try:
        if grid.rank == 0:
            save_mod._sha256_file = lambda p: (time.sleep(delay_s), original(p))[1]
        model = Net(grid)
        path = save_checkpoint(root, model, _opt(model), grid, step=1)
        grid.comm.all_reduce(torch.ones(1), "d")          # and training goes on together
        return os.path.basename(path)
    finally:
        save_mod._sha256_file = original
        grid.destroy()


@pytest.mark.slow
def test_a_slow_checkpoint_write_is_not_a_collective_timeout(ranks, tmp_path):
    assert ranks(2, rank_slow_writer, str(tmp_path / "ck"), 3.0) == ["step-00000001"] * 2
