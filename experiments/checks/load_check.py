"""``axgrid.from_pretrained`` onto a device with host memory bounded: a random-weight LLaMA is written by
``save_pretrained`` (sharded), then loaded on a 1x1x1x1 grid with ``device=`` the grid's device, and checked:

- logits equal transformers' ``from_pretrained`` of the same folder moved to the device (fp32; TF32 off);
- the bytes read equal the model's own bytes (every tensor read once);
- on CUDA: the allocator's memory grew by the parameters' bytes (nothing else stays on the GPU but the buffers,
  within 1 MiB), and the host's
  peak RSS rose by at most the largest tensor + one 16 MiB band + 64 MiB (the slices pass through the host one
  at a time, never the model); on the CPU the parameters are host memory, so the host bound is the parameters +
  the largest tensor + 64 MiB.

One line (``experiments/checks/gpu_check.sh`` runs :func:`check` on the GPU; ``python experiments/checks/load_check.py --device
cpu`` runs it here, tests/test_gpu_check.py):

    load_check: LLaMA 4M parameters (fp32, 6 files) on cpu: 0.1 s, read 13 MiB = own; params 13 MiB in host
    memory; host peak +14 MiB (bound 97 MiB); logits max diff 0.0e+00 vs HF: PASS

Host peak RSS is the kernel's ``VmHWM``, reset with ``/proc/self/clear_refs`` (Linux).
"""
from __future__ import annotations

import argparse
import gc
import os
import re
import sys
import tempfile
import time

import torch

import axgrid
from axgrid.device import cuda as gpu

#: Host allowance beyond one tensor in flight: the band a column-split box is read in, and the allocator's slack.
SLACK_BYTES = 16 * 2**20 + 64 * 2**20
#: GPU memory beyond the parameters that the loaded model may hold: its buffers (rotary ``inv_freq``), each rounded
#: up to the caching allocator's 512-byte blocks.
GPU_EXTRA_BYTES = 2**20


def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+) kB", f.read()).group(1)) * 1024


def make_checkpoint(where: str, hidden: int, layers: int, vocab: int, shard: str) -> int:
    """A random-weight LLaMA saved by ``save_pretrained`` into ``where``; returns its parameter count."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
                      num_key_value_heads=max(1, hidden // 128), intermediate_size=hidden * 11 // 4,
                      vocab_size=vocab, max_position_embeddings=128, tie_word_embeddings=False, bos_token_id=0,
                      eos_token_id=0, pad_token_id=0)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(where, max_shard_size=shard)
    n = sum(p.numel() for p in model.parameters())
    del model
    gc.collect()
    return n


def check(grid, hidden: int = 1024, layers: int = 4, vocab: int = 32000, shard: str = "200MB",
          workdir: str | None = None) -> tuple[bool, str]:
    """Write, load and check the checkpoint on ``grid`` (1x1x1x1); returns (passed, the report line)."""
    import axgrid
    from transformers import LlamaForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()
    if grid.world_size != 1:
        raise ValueError(f"load check: a 1x1x1x1 grid, got {grid.shape}")
    dev, acc = grid.device, grid.accelerator
    torch.backends.cuda.matmul.allow_tf32 = False
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = os.path.join(tmp, "llama")
        n = make_checkpoint(path, hidden, layers, vocab, shard)
        files = len([f for f in os.listdir(path) if f.endswith(".safetensors")])
        acc.synchronize()
        gpu0 = acc.allocated_memory()
        host0 = _rss("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        t0 = time.perf_counter()
        model = axgrid.from_pretrained(path, grid, device=str(dev))
        acc.synchronize()
        load_s = time.perf_counter() - t0
        host_rise = _rss("VmHWM") - host0
        params = [p for p in model.parameters()]
        own = sum(p.numel() * p.element_size() for p in params)
        largest = max(p.numel() * p.element_size() for p in params)
        read = model.axgrid_load_report.bytes_read
        on_device = all(t.device == dev for t in [*params, *model.buffers()])
        gpu_rise = acc.allocated_memory() - gpu0 if acc.is_gpu else own
        host_bound = largest + SLACK_BYTES + (own if not acc.is_gpu else 0)
        ids = torch.randint(0, vocab, (2, 32), generator=torch.Generator().manual_seed(1)).to(dev)
        with torch.no_grad():
            mine = model(input_ids=ids).logits.float()
            del model
            ref_model = LlamaForCausalLM.from_pretrained(path).to(dev).eval()
            ref = ref_model(input_ids=ids).logits.float()
            del ref_model
        diff = float((mine - ref).abs().max())
    gpu_ok = own <= gpu_rise <= own + GPU_EXTRA_BYTES      # the parameters, plus buffers and the allocator's rounding
    ok = on_device and read == own and gpu_ok and host_rise <= host_bound and diff <= 1e-4
    mib = 2**20
    line = (f"load_check: LLaMA {n / 1e6:.0f}M parameters (fp32, {files} files) on {dev}: {load_s:.1f} s, read "
            f"{read / mib:.0f} MiB {'=' if read == own else '!='} own; "
            + (f"GPU memory +{gpu_rise / mib:.0f} MiB (params {own / mib:.0f} MiB)" if acc.is_gpu else
               f"params {own / mib:.0f} MiB in host memory")
            + f"{'' if on_device else ', NOT all on the device'}; host peak "
            f"+{host_rise / mib:.0f} MiB (bound {host_bound / mib:.0f} MiB); logits max diff {diff:.1e} vs HF: "
            f"{'PASS' if ok else 'FAIL'}")
    return ok, line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if gpu.count() > 0 else "cpu")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--shard", default="200MB", help="max_shard_size of the written checkpoint")
    a = ap.parse_args(argv)
    if a.device == "cuda" and gpu.count() == 0:
        print(f"load_check: FAIL: --device cuda but torch {torch.__version__} sees no CUDA GPU", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    grid = axgrid.init("1x1x1x1", config=axgrid.RuntimeConfig(timeout_s=120, seed=0))
    try:
        ok, line = check(grid, a.hidden, a.layers, a.vocab, a.shard)
    finally:
        grid.destroy()
    print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "load_check")     # errors said once, as one line (axgrid.launch.errors)
