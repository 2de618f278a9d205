"""Timing of collectives is gated on the backend, not on whether the machine has a GPU: gloo ranks on a GPU node time
with the host clock and never touch CUDA (no context per rank, no synchronisation). The GPU path (events on the
compute stream, nothing synchronised inside the step) runs in tests/unit/test_fakecuda.py."""
from __future__ import annotations

import torch

import axgrid


def rank_gloo_on_a_gpu_node() -> dict:
    """torch says a GPU is there, and every CUDA call it could make raises: a timed, traced gloo step makes none."""
    calls: list[str] = []
    saved = {}

    def trap(name):
        def call(*a, **k):
            calls.append(name)
            raise RuntimeError(f"torch.cuda.{name} called on a gloo rank")
        return call
    for name in ("synchronize", "current_device", "Event", "current_stream", "set_device", "device_count"):
        saved[name] = getattr(torch.cuda, name)
        setattr(torch.cuda, name, trap(name))
    saved["is_available"] = torch.cuda.is_available
    torch.cuda.is_available = lambda: True
    try:
        cfg = axgrid.RuntimeConfig(timeout_s=60, record_timing=True, trace=True, seed=0)
        grid = axgrid.init("2x1x1x1", config=cfg, backend="gloo")
        try:
            t = torch.ones(1024)
            grid.comm.all_reduce(t, "x")
            pending = grid.comm.all_gather(t, "x", async_op=True)
            pending.wait()
            entry = grid.ledger.snapshot()[("x", "all_reduce")]
            return {"calls": calls, "device": str(grid.device), "seconds": entry.seconds,
                    "spans": len(grid.comm.tracer.events)}
        finally:
            grid.destroy()
    finally:
        for name, fn in saved.items():
            setattr(torch.cuda, name, fn)


def test_gloo_ranks_on_a_gpu_node_time_without_cuda(ranks):
    for got in ranks(2, rank_gloo_on_a_gpu_node):
        assert got["calls"] == [] and got["device"] == "cpu"
        assert got["seconds"] > 0 and got["spans"] >= 4       # comm + wait spans of both collectives
