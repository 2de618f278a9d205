"""The library as on GPUs, on this CPU (axgrid/dryrun/harness.py): one rank of a multi-rank grid, its tensors fake on
a GPU device, its collectives on torch's fake process group. Every case fails on a tensor left on the host, an
unintended host read or copy in the hot path (``HostWatch``), or a device mismatch (raised by the fake tensors).

- On ``cuda:0`` (forward only; a CPU build of torch cannot run a CUDA backward): ``parallelize`` of a model built on
  the CPU, then a forward; ``from_pretrained(device="cuda:0")``; ``generate`` on a Hugging Face model and on the
  GPT; the forward of a training step under bf16 autocast for the GPT and a Llama plan, its weights gathered over z
  in bf16.
- On torch's PrivateUse1 device registered as "fakegpu" (autograd works there): whole training steps -- forward,
  backward, gradient sync, clipping, AdamW -- for the GPT (every overlap, timed) and a Llama plan, with no
  synchronisation of the device inside the timed step.

Each device runs in a process of its own (``run_isolated``): registering a device guard cannot be undone, and an
abort must not take pytest with it. What is not covered, and why: see docs/gpu.md#what-the-dry-run-covers."""
from __future__ import annotations

import os

import pytest

from conftest import PRELOAD
from axgrid.testing.isolated import run_isolated

pytestmark = pytest.mark.fakecuda

GRID, RANKS = "2x2x2x1", (0, 5)     # every tensor-parallel dimension; two ranks' coordinates
FULL = 5                            # the rank that also loads, generates and runs the training forwards


def _llama_and_gpt(tmp: str):
    from helpers.tiny_hf import tiny_llama
    from axgrid.models.gpt import GPTConfig
    from axgrid.spec import TransformerShape
    path = tiny_llama(os.path.join(tmp, "llama"), vocab=64)
    return path, GPTConfig(TransformerShape("fake", 2, 32, 4, 16, 64))


def _left_on_host(model, device) -> list[str]:
    return [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device != device]


def _gathered_bytes(model) -> int:
    """What one forward's weight gathers over z move in bf16 (each FC layer's padded block, 2 bytes an element)."""
    from axgrid.tensor_parallel.linear import Linear
    return sum(2 * m.sharding.padded_numel for m in model.modules() if isinstance(m, Linear))


def cuda_cases(tmp: str) -> dict:
    """On one process: every forward case, on two ranks of the grid."""
    import warnings
    import torch
    import axgrid
    from transformers import LlamaForCausalLM
    from axgrid.models.gpt import GPT
    from axgrid.plans.causal_lm import causal_lm_loss
    from axgrid.dryrun.harness import dry_run
    warnings.simplefilter("ignore")
    path, cfg = _llama_and_gpt(tmp)
    ids = torch.randint(0, 64, (4, 9), generator=torch.Generator().manual_seed(0))
    out: dict = {}
    from axgrid.tensor_parallel.linear import Linear
    initialise = Linear.reset_parameters
    initialised: list = []
    for rank in RANKS:
        cpu_model = LlamaForCausalLM.from_pretrained(path)          # built on the CPU, real weights
        got: dict = {}
        with dry_run(GRID, rank=rank) as run:
            dev = run.grid.device
            Linear.reset_parameters = lambda self: (initialised.append(1), initialise(self))[1]
            try:
                with run.watch():
                    model = axgrid.parallelize(cpu_model, run.grid)  # copies the weights: no initialisation first
                    logits = model(input_ids=ids[:, :-1].to(dev)).logits
            finally:
                Linear.reset_parameters = initialise
            got["parallelize"] = (_left_on_host(model, dev), str(logits.device), tuple(logits.shape), len(initialised))
            got["violations"] = [str(v) for v in run.host.violations]
            if rank != FULL:
                out[rank] = got
                continue
            with run.watch():
                loaded = axgrid.from_pretrained(path, run.grid, device="cuda:0")
                new = axgrid.generate(loaded, ids, run.grid, max_new_tokens=2, eos_token_id=[])   # fake data: no EOS
            got["from_pretrained"] = (_left_on_host(loaded, dev), str(new.device), tuple(new.shape))
            with run.watch():
                gpt = GPT(cfg, run.grid)             # hashed initialisation, computed on the device
            model.train()
            z_gathers = ("z", "all_gather")
            before = run.grid.ledger.entries[z_gathers].bytes if z_gathers in run.grid.ledger.entries else 0
            with run.watch():
                with run.autocast(torch.bfloat16):
                    gpt_loss = gpt(ids[:, :-1].to(dev), ids[:, 1:].to(dev))          # the step's forward
                gathered = run.grid.ledger.entries[z_gathers].bytes - before
                with run.autocast(torch.bfloat16):
                    llama_loss = causal_lm_loss(model, ids[:, :-1].to(dev), ids[:, 1:].to(dev), None, 32.0)
                tokens = axgrid.generate(gpt, ids, run.grid, max_new_tokens=2)
            got["train_forward"] = (str(gpt_loss.device), gpt_loss.requires_grad, str(llama_loss.device),
                                    llama_loss.requires_grad, gathered > 0, str(tokens.device))
            got["gpt_gathered"] = (gathered, _gathered_bytes(gpt))
            got["violations"] = [str(v) for v in run.host.violations]
            got["intended_reads"] = run.host.intended_reads
        out[rank] = got
    return out


def harness_catches(tmp: str) -> dict:
    """What the harness reports for code that does what a GPU run must not: mix a host tensor in, read a value on
    the host, copy to the host, compute on the host."""
    import torch
    from axgrid.dryrun.harness import dry_run
    with dry_run("1x1x2x1", rank=1) as run:
        dev = run.grid.device
        x = torch.empty(4, 8, device=dev)
        try:
            x @ torch.ones(8, 2)                       # a weight left on the host
            mismatch = "no error"
        except RuntimeError as e:
            mismatch = str(e)
        with run.watch():
            float(x.sum())                             # .item() in the hot path
            x.cpu()
            torch.arange(1000).float().sum()           # host compute
        return {"mismatch": mismatch, "violations": [v.what for v in run.host.violations]}


@pytest.fixture(scope="module")
def cuda(tmp_path_factory):
    return run_isolated(cuda_cases, str(tmp_path_factory.mktemp("fakecuda")), preload=tuple(PRELOAD))


@pytest.mark.parametrize("rank", RANKS)
def test_a_model_built_on_the_cpu_runs_on_the_grids_gpu(cuda, rank):
    left, device, shape, initialised = cuda[rank]["parallelize"]
    assert left == [], f"left on the host after parallelize: {left}"
    assert initialised == 0, "from_dense initialised layers it then overwrote"
    assert device == "cuda:0" and shape == (2, 8, 32)         # [B/Gz, S, V/Gy]
    assert cuda[rank]["violations"] == [], "\n".join(cuda[rank]["violations"])


def test_from_pretrained_and_generate_on_the_gpu(cuda):
    left, device, shape = cuda[FULL]["from_pretrained"]
    assert left == [] and device == "cuda:0" and shape == (4, 11)


def test_the_forward_of_a_training_step_gathers_bf16_weights_and_leaves_nothing_on_the_host(cuda):
    got = cuda[FULL]
    gpt_device, gpt_grad, llama_device, llama_grad, gathered, gen_device = got["train_forward"]
    assert gpt_device == llama_device == gen_device == "cuda:0" and gpt_grad and llama_grad and gathered
    moved, bf16 = got["gpt_gathered"]
    assert moved == bf16, f"the GPT's forward gathered {moved} bytes over z, {bf16} in bf16"
    assert got["violations"] == [], "\n".join(got["violations"])
    assert got["intended_reads"] > 0          # generate's prompt checks and stopping test: through host_read


def test_the_harness_reports_host_traffic_and_device_mismatches(tmp_path):
    got = run_isolated(harness_catches, str(tmp_path), preload=tuple(PRELOAD))
    assert "Expected all tensors to be on the same device" in got["mismatch"]
    assert got["violations"][:2] == ["host read", "copy to host"] and set(got["violations"][2:]) == {"host compute"}


def fakegpu_steps(tmp: str) -> dict:
    """Whole training steps on the fakegpu device: the GPT on 2x2x2x2 (every overlap, timed, two micro-batches,
    clipping) and the Llama plan of a model built on the CPU on 2x2x2x1."""
    import warnings
    import torch
    import axgrid
    from transformers import LlamaForCausalLM
    from axgrid.models.gpt import GPT
    from axgrid.plans.causal_lm import causal_lm_loss
    from axgrid.dryrun.harness import dry_run
    from axgrid.train import train_step
    warnings.simplefilter("ignore")
    path, cfg = _llama_and_gpt(tmp)
    ids = torch.randint(0, 64, (8, 17), generator=torch.Generator().manual_seed(0))
    out: dict = {}
    conf = axgrid.RuntimeConfig(timeout_s=60, seed=0, overlap=axgrid.OverlapConfig.parse("all"), record_timing=True,
                                trace=True)
    with dry_run("2x2x2x2", rank=9, device="fakegpu", config=conf) as run:
        dev = run.grid.device
        gpt = GPT(cfg, run.grid)
        opt = torch.optim.AdamW(gpt.parameters(), lr=1e-3, capturable=True)

        def loss_of(i: int) -> torch.Tensor:
            rows = ids[i * 4:(i + 1) * 4].to(dev)
            with run.autocast(torch.bfloat16):
                return gpt(rows[:, :-1], rows[:, 1:])
        syncs, events = run.device.synchronizations, run.device.events
        with run.watch():
            step = train_step(gpt, opt, loss_of, run.grid, microbatches=2, clip=1.0)
        in_step = (run.device.synchronizations - syncs, run.device.events - events)
        timed = run.grid.ledger.snapshot()
        spans = run.grid.comm.tracer.events
        gemms = sum(e["cat"] == "compute" for e in spans)
        collectives = sum(e["cat"] == "comm" for e in spans)
        out["gpt"] = {"grads": sorted({str(p.grad.device) for p in gpt.parameters()}), "in_step": in_step,
                      "spans": (gemms, collectives),
                      "timed": all(e.seconds > 0 for e in timed.values()), "loss": str(step.loss.device),
                      "norm": str(step.grad_norm.device), "violations": [str(v) for v in run.host.violations]}
    cpu_model = LlamaForCausalLM.from_pretrained(path)
    with dry_run("2x2x2x1", rank=6, device="fakegpu") as run:
        dev = run.grid.device
        model = axgrid.parallelize(cpu_model, run.grid).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)

        def llama_loss(i: int) -> torch.Tensor:
            with run.autocast(torch.bfloat16):
                return causal_lm_loss(model, ids[:4, :-1].to(dev), ids[:4, 1:].to(dev), None, 64.0)
        with run.watch():
            train_step(model, opt, llama_loss, run.grid, microbatches=1, clip=1.0)
        out["llama"] = {"grads": sorted({str(p.grad.device) for p in model.parameters()}),
                        "left": _left_on_host(model, dev), "violations": [str(v) for v in run.host.violations]}
    return out


@pytest.mark.slow
def test_training_steps_run_forward_and_backward_on_the_device(tmp_path):
    got = run_isolated(fakegpu_steps, str(tmp_path), preload=tuple(PRELOAD))
    gpt, llama = got["gpt"], got["llama"]
    assert gpt["grads"] == ["fakegpu:0"] and gpt["loss"] == gpt["norm"] == "fakegpu:0"
    assert gpt["violations"] == [], "\n".join(gpt["violations"])
    syncs, events = gpt["in_step"]
    assert syncs == 0 and events > 0, "the timed step synchronised the device, or recorded no events"
    gemms, collectives = gpt["spans"]           # traced GEMMs and collectives span events on the device's stream
    assert gemms > 0 and collectives > 0 and events >= 2 * (gemms + collectives)
    assert gpt["timed"]                       # every collective timed from its events, read after the step
    assert llama["grads"] == ["fakegpu:0"] and llama["left"] == []
    assert llama["violations"] == [], "\n".join(llama["violations"])
