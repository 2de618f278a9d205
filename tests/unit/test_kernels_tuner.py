"""GemmTuner inside autograd, multi-rank agreement, shapes and the CLI."""
import json

import pytest
import torch

from axgrid.kernels import Agreement, GemmCache, GemmSignature, GemmTuner, layer_gemm_shapes
from axgrid.kernels.cli import main

torch.set_num_threads(1)
FAST = dict(max_tune_seconds=0.5, warmup=1, repeats=3)


class _Linear(torch.autograd.Function):
    """Y = X Wᵀ with all three GEMMs through the tuner (as axgrid's Linear does)."""

    @staticmethod
    def forward(ctx, x, w, tuner):
        ctx.save_for_backward(x, w)
        ctx.tuner = tuner
        return tuner(x, w.t(), "forward")

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        return ctx.tuner(dy, w, "input_grad"), ctx.tuner(dy.t(), x, "weight_grad"), None


def test_tuner_inside_autograd_matches_plain(tmp_path):
    tuner = GemmTuner(cache_path=tmp_path / "g.json", **FAST)
    x = torch.randn(16, 12, requires_grad=True)
    w = torch.randn(20, 12, requires_grad=True)
    y = _Linear.apply(x, w, tuner)
    y.square().sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    (x @ w.t()).square().sum().backward()
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, w.grad)
    assert tuner.stats.tuned == 3 and tuner.stats.layout_mismatch == 0
    assert sum(tuner.stats.calls.values()) == 3


def test_grad_flows_when_called_outside_a_function(tmp_path):
    tuner = GemmTuner(cache_path=tmp_path / "g.json", **FAST)
    a = torch.randn(5, 4, requires_grad=True)
    tuner(a, torch.randn(4, 3), "input_grad").sum().backward()
    assert a.grad is not None


def test_agreement_source_decides_others_adopt(tmp_path):
    sent = []

    def bcast(obj, src):  # fake 2-rank group: whatever rank 0 sent is what everyone receives
        if obj is not None:
            sent.append(obj)
        return sent[-1] if sent else "torch:NT:AB"

    src = GemmTuner(cache_path=tmp_path / "a.json", group=Agreement(0, bcast), **FAST)
    other = GemmTuner(cache_path=tmp_path / "b.json", group=Agreement(1, bcast), **FAST)
    w0 = src.choice(12, 10, 8, "fp32", "cpu", "forward")
    assert other.choice(12, 10, 8, "fp32", "cpu", "forward") == w0 == sent[0]
    assert (src.stats.tuned, other.stats.tuned) == (1, 0)
    assert not (tmp_path / "b.json").exists()


def test_agreement_failure_reaches_other_ranks():
    from axgrid.kernels import agree_on
    box = []

    def bcast(obj, src):
        if obj is not None:
            box.append(obj)
        return box[-1]

    def boom():
        raise OSError("disk on fire")

    with pytest.raises(OSError):
        agree_on(boom, Agreement(0, bcast))
    with pytest.raises(RuntimeError, match="failed on source rank 0: OSError"):
        agree_on(boom, Agreement(1, bcast))


def test_torch_distributed_group(tmp_path):
    import torch.distributed as dist
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        t = GemmTuner(cache_path=tmp_path / "g.json", group=dist.group.WORLD, **FAST)
        a, b = torch.randn(6, 5), torch.randn(5, 4)
        torch.testing.assert_close(t(a, b, "input_grad"), a @ b)
        assert t.stats.tuned == 1
    finally:
        dist.destroy_process_group()


def test_layer_gemm_shapes_hand_checked():
    # gpt-tiny: hidden 64; grid gx=2, gy=4, gz=2, gd=1; 32 tokens -> m' = 32 / (1*2) = 16
    assert layer_gemm_shapes("gpt-tiny", "2x4x2x1", 32) == [
        (16, 48, 32, "forward"), (16, 32, 48, "input_grad"), (48, 32, 16, "weight_grad"),   # QKV W[192,64] normal
        (16, 32, 16, "forward"), (16, 16, 32, "input_grad"), (32, 16, 16, "weight_grad"),   # out W[64,64] transposed
        (16, 64, 32, "forward"), (16, 32, 64, "input_grad"), (64, 32, 16, "weight_grad"),   # up W[256,64] normal
        (16, 32, 64, "forward"), (16, 64, 32, "input_grad"), (32, 64, 16, "weight_grad"),   # down W[64,256] transposed
    ]
    assert layer_gemm_shapes((2, 64, 4), [1, 1, 1, 1], 8)[0] == (8, 192, 64, "forward")


def test_bad_grid_and_sizes_are_named():
    with pytest.raises(ValueError, match="grid '2x2x2' leaves Gdata out"):
        layer_gemm_shapes("gpt-tiny", "2x2x2", 8)
    with pytest.raises(ValueError, match="tokens .* = 30 is not divisible by 4"):
        layer_gemm_shapes("gpt-tiny", "1x1x2x2", 30)
    with pytest.raises(ValueError, match="unknown model 'gpt-7b'"):
        layer_gemm_shapes("gpt-7b", "1x1x1x1", 8)
    with pytest.raises(ValueError, match="mode 'auto'"):
        GemmTuner("auto")


def test_cli_tune_show_export(tmp_path, capsys):
    cache = str(tmp_path / "g.json")
    assert main(["tune", "--model", "gpt-tiny", "--grid", "2x2x1x1", "--dtype", "fp32", "--tokens", "16",
                 "--device", "cpu", "--cache", cache, "--max-tune-seconds", "0.3", "--warmup", "1",
                 "--repeats", "3"]) == 0
    n_shapes = len(layer_gemm_shapes("gpt-tiny", "2x2x1x1", 16))
    assert len(GemmCache(cache).load()) == n_shapes
    assert main(["show", "--cache", cache]) == 0
    assert "forward" in capsys.readouterr().out
    out = tmp_path / "eff.json"
    assert main(["export-efficiency", str(out), "--cache", cache]) == 0
    records = json.loads(out.read_text())
    assert len(records) == n_shapes
    assert {"m", "n", "k", "dtype", "role", "device", "flops_per_s"} <= set(records[0])
    assert all(r["flops_per_s"] > 0 for r in records)
    assert main(["tune", "--model", "gpt-tiny", "--grid", "3x1x1x1", "--cache", cache]) == 2


def _gloo_rank(rank: int, store: str, tmp: str, out) -> None:
    import torch.distributed as dist

    from axgrid.kernels.tuner import GemmTuner as Tuner
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        t = Tuner("cache-only", cache_path=f"{tmp}/rank{rank}.json", group=dist.group.WORLD)
        a, b = torch.randn(12, 8), torch.randn(10, 8).t()
        ok = torch.allclose(t(a, b, "forward"), a @ b, rtol=1e-5, atol=1e-5)
        out.put((rank, t.choice(12, 10, 8, "fp32", "cpu", "forward"), dict(t.stats.calls), ok))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_follow_rank0(tmp_path):
    import multiprocessing as mp

    from axgrid.kernels.validators import current_validators
    sig = GemmSignature.make(12, 10, 8, "fp32", "cpu", "forward")
    valid = {**current_validators("cpu"), "cpu_threads": 1}
    GemmCache(tmp_path / "rank1.json").put(sig, {"winner": "torch:TT:BtAt", "validators": valid, "times_s": {}})
    assert GemmTuner("cache-only", cache_path=tmp_path / "rank1.json").choice(12, 10, 8, "fp32", "cpu",
                                                                            "forward") == "torch:TT:BtAt"
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_gloo_rank, args=(r, str(tmp_path / "store"), str(tmp_path), out)) for r in (0, 1)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    # rank 0 has no entry -> default; rank 1's own cache says TT:BtAt but it must follow rank 0
    assert results == [(0, "default", {"default": 1}, True), (1, "default", {"default": 1}, True)]
