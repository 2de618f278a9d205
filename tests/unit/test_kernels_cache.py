"""Persistent cache: round trip, stale validators, corrupt files, modes, decisions honoured, concurrency."""
import json
import multiprocessing as mp
import os
import warnings

import pytest
import torch

from axgrid import kernels
from axgrid.kernels import GemmCache, GemmCacheWarning, GemmSignature, GemmTuner
from axgrid.kernels import candidates as cands
from axgrid.kernels.validators import current_validators

torch.set_num_threads(1)
FAST = dict(max_tune_seconds=0.5, warmup=1, repeats=3)


def _fwd_operands(m=12, n=10, k=8):
    g = torch.Generator().manual_seed(1)
    return torch.randn(m, k, generator=g), torch.randn(n, k, generator=g).t()


def _entry(sig: GemmSignature, winner: str, **validators) -> dict:
    return {"m": sig.m, "n": sig.n, "k": sig.k, "dtype": sig.dtype, "device": sig.device, "role": sig.role,
            "winner": winner, "times_s": {"default": 1e-3, winner: 5e-4}, "rounds": 3, "margin": 0.03,
            "validators": {**current_validators("cpu"), **validators}}


def test_round_trip(tmp_path):
    path = tmp_path / "gemm.json"
    a, b = _fwd_operands()
    t1 = GemmTuner(cache_path=path, **FAST)
    torch.testing.assert_close(t1(a, b, "forward"), a @ b)
    assert t1.stats.tuned == 1
    winner = t1.choice(12, 10, 8, torch.float32, "cpu", "forward")
    entries = GemmCache(path).load()
    (key,) = entries
    assert key == GemmSignature.make(12, 10, 8, "fp32", "cpu", "forward").key
    assert entries[key]["winner"] == winner and set(entries[key]["times_s"]) >= {"default", "torch:NN:BtAt"}
    assert entries[key]["validators"]["torch"] == torch.__version__
    for mode in ("on-first-use", "cache-only"):
        t2 = GemmTuner(mode, cache_path=path, **FAST)
        assert t2.choice(12, 10, 8, "fp32", "cpu", "forward") == winner
        assert (t2.stats.tuned, t2.stats.cache_hits) == (0, 1)


def test_stale_validators_trigger_retune(tmp_path):
    path = tmp_path / "gemm.json"
    sig = GemmSignature.make(12, 10, 8, "fp32", "cpu", "forward")
    GemmCache(path).put(sig, _entry(sig, "torch:TT:BtAt", torch="0.0-old"))
    only = GemmTuner("cache-only", cache_path=path, **FAST)
    assert only.choice(12, 10, 8, "fp32", "cpu", "forward") == "default"
    assert (only.stats.cache_stale, only.stats.cache_misses, only.stats.tuned) == (1, 1, 0)
    t = GemmTuner(cache_path=path, **FAST)
    t.choice(12, 10, 8, "fp32", "cpu", "forward")
    assert (t.stats.cache_stale, t.stats.tuned) == (1, 1)
    assert GemmCache(path).load()[sig.key]["validators"] == current_validators("cpu")


@pytest.mark.parametrize("garbage", [b"{not json", b"\xff\xfe\x00garbage", b'["a list"]',
                                     b'{"format": "axgrid-gemm-cache/1", "entries": {"x": 3}}'])
def test_corrupt_file_one_warning_then_rebuilt(tmp_path, garbage):
    path = tmp_path / "gemm.json"
    path.write_bytes(garbage)
    t = GemmTuner(cache_path=path, **FAST)
    a, b = _fwd_operands()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(t(a, b, "forward"), a @ b)
        t(b.t().contiguous(), a.t().contiguous(), "input_grad")  # a second signature: no second warning
    assert [w.category for w in caught] == [GemmCacheWarning]
    assert "corrupt" in str(caught[0].message) or "cannot read" in str(caught[0].message)
    data = json.loads(path.read_text())
    assert data["format"] == "axgrid-gemm-cache/1" and len(data["entries"]) == 2


def test_unwritable_cache_warns_once_and_keeps_working(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    t = GemmTuner(cache_path=blocker / "gemm.json", **FAST)
    a, b = _fwd_operands()
    with pytest.warns(GemmCacheWarning, match="cannot write") as rec:
        torch.testing.assert_close(t(a, b, "forward"), a @ b)
        t(b.t().contiguous(), a.t().contiguous(), "input_grad")
    assert len([w for w in rec if w.category is GemmCacheWarning]) == 1


def test_off_and_cache_only_never_time_or_write(tmp_path):
    path = tmp_path / "gemm.json"
    a, b = _fwd_operands()
    for mode in ("off", "cache-only"):
        t = GemmTuner(mode, cache_path=path)
        torch.testing.assert_close(t(a, b, "forward"), a @ b)
        assert t.stats.tuned == 0 and t.stats.calls == {"default": 1}
        assert t.choice(12, 10, 8, "fp32", "cpu", "forward") == "default"
    assert not path.exists()


@pytest.mark.parametrize("forced", ["torch:TT:BtAt", "torch:NN:AB", "torch:TN:AB"])
def test_cached_decision_is_used(tmp_path, monkeypatch, forced):
    path = tmp_path / "gemm.json"
    sig = GemmSignature.make(12, 10, 8, "fp32", "cpu", "forward")
    GemmCache(path).put(sig, _entry(sig, forced))
    seen = []
    real_run = cands.run
    monkeypatch.setattr(cands, "run", lambda c, a, b: seen.append(c.name) or real_run(c, a, b))
    t = GemmTuner(cache_path=path, **FAST)
    a, b = _fwd_operands()
    for _ in range(3):
        torch.testing.assert_close(t(a, b, "forward"), a @ b)
    assert t.stats.calls == {forced: 3} and seen == [forced] * 3 and t.stats.tuned == 0


def test_env_and_xdg_paths(monkeypatch, tmp_path):
    monkeypatch.delenv("AXGRID_GEMM_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kernels.default_cache_path() == tmp_path / "xdg" / "axgrid" / "gemm.json"
    monkeypatch.setenv("AXGRID_GEMM_CACHE", str(tmp_path / "env.json"))
    assert GemmTuner().cache.path == tmp_path / "env.json"
    assert GemmTuner(cache_path=tmp_path / "arg.json").cache.path == tmp_path / "arg.json"


def _writer(path: str, wid: int, count: int) -> None:
    cache = GemmCache(path)
    for i in range(count):
        sig = GemmSignature.make(wid + 1, i + 1, 7, "fp32", "cpu", "forward")
        cache.put(sig, {"m": sig.m, "n": sig.n, "k": 7, "winner": "default", "times_s": {"default": 1.0}})


def test_concurrent_writers_keep_all_entries(tmp_path):
    path = str(tmp_path / "gemm.json")
    nproc, count = 4, 15
    ctx = mp.get_context("fork")  # children only do json + file I/O, never torch compute
    procs = [ctx.Process(target=_writer, args=(path, w, count)) for w in range(nproc)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    entries = GemmCache(path).load()
    assert len(entries) == nproc * count
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_bad_entries_are_dropped_one_by_one(tmp_path):
    path = tmp_path / "gemm.json"
    good = {GemmSignature.make(12, 10, 8, "fp32", "cpu", r).key: _entry(GemmSignature.make(12, 10, 8, "fp32", "cpu", r),
                                                                       "torch:TT:BtAt")
            for r in ("forward", "input_grad")}
    bad = {"no-winner": {"m": 12, "n": 10, "k": 8}, "text-size": {"winner": "default", "m": "12"},
           "odd-winner": {"winner": "torch:XX:AB"}}
    path.write_text(json.dumps({"format": "axgrid-gemm-cache/1", "entries": {**good, **bad}}))
    cache = GemmCache(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cache.load() == good
        cache.load()                                                   # the same bad entries: no second warning
    assert [w.category for w in caught] == [GemmCacheWarning]
    msg = str(caught[0].message)
    assert all(repr(k) in msg for k in bad) and "no 'winner'" in msg and "'m' is '12'" in msg, msg
    sig = GemmSignature.make(5, 6, 7, "fp32", "cpu", "forward")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cache.put(sig, _entry(sig, "default"))
    assert set(json.loads(path.read_text())["entries"]) == set(good) | {sig.key}   # only the bad ones are gone


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_cache_file_mode_follows_the_umask(tmp_path, umask, mode):
    path = tmp_path / "gemm.json"
    sig = GemmSignature.make(5, 6, 7, "fp32", "cpu", "forward")
    old = os.umask(umask)
    try:
        assert GemmCache(path).put(sig, _entry(sig, "default"))
        assert GemmCache(path).put(sig, _entry(sig, "default"))       # a rewrite too
    finally:
        os.umask(old)
    assert (path.stat().st_mode & 0o777) == mode


def test_show_and_export_tolerate_missing_fields(tmp_path, capsys):
    from axgrid.kernels.cli import main
    path = tmp_path / "gemm.json"
    sig = GemmSignature.make(12, 10, 8, "fp32", "cpu", "forward")
    entries = {sig.key: _entry(sig, "torch:TT:BtAt"), "hand-written": {"winner": "default"},
               "no-sizes": {"winner": "torch:NN:AB", "device": "cpu", "times_s": {"torch:NN:AB": 1e-3}}}
    path.write_text(json.dumps({"format": "axgrid-gemm-cache/1", "entries": entries}))
    assert main(["show", "--cache", str(path)]) == 0
    out = capsys.readouterr().out
    assert "(3 entries)" in out and "hand-written" not in out and out.count("?") >= 5, out
    assert main(["export-efficiency", str(tmp_path / "eff.json"), "--cache", str(path)]) == 0
    assert len(json.loads((tmp_path / "eff.json").read_text())) == 1


def test_measure_keeps_to_its_time_budget():
    import time
    from axgrid.kernels.timing import measure
    calls = []
    fns = {name: (lambda name=name: calls.append(name) or time.sleep(0.05)) for name in "dabcefgh"}
    t0 = time.perf_counter()
    meas = measure(fns, "cpu", warmup=5, repeats=20, max_seconds=0.12)
    took = time.perf_counter() - t0
    assert took < 0.45, took                       # 8 candidates x (warm-up + one timed round) would take 0.8 s
    assert "d" in meas.median_s and len(calls) <= 5, calls


def test_tuner_budget_leaves_candidates_untimed(tmp_path):
    t = GemmTuner(cache_path=tmp_path / "gemm.json", max_tune_seconds=1e-4, warmup=5, repeats=20)
    entry = t.tune(384, 384, 384, "fp32", "cpu", "forward")
    assert entry["winner"] == "default" and set(entry["times_s"]) == {"default"}
    assert len(entry["untimed"]) == len(cands.candidates_for(GemmSignature.make(384, 384, 384, "fp32", "cpu",
                                                                                "forward"))) - 1
