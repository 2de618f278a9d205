"""axgrid: Agarwal's 3D parallel matrix multiplication on a Gx x Gy x Gz x Gdata grid (the AxoNN algorithm).

    grid = axgrid.init("2x2x2x1")          # or axgrid.init(2, 2, 2)
    layer = axgrid.nn.Linear(1024, 4096)   # drop-in for nn.Linear
    model = axgrid.parallelize(model, grid)
    ...; loss.backward(); axgrid.sync_gradients(model, grid); opt.step()
    opt = axgrid.shard_optimizer(opt, model, grid)   # RuntimeConfig(zero=1|2): optimizer state sharded over d
    axgrid.train_step(model, opt, loss_of, grid, microbatches=4, clip=1.0)   # the same, micro-batches averaged
    ids = axgrid.local_batch(batch, grid)  # this data-parallel rank's rows: [B, S] -> [B/Gd, S]
    dense = axgrid.to_dense(model, grid)   # or axgrid.export_pretrained(hf_model, "out", grid)
    axgrid.lora(model, grid, r=16, alpha=32, targets=["q_proj", "v_proj"])   # LoRA: base frozen, PEFT's format

The public names below load on first use (PEP 562), so the torch-free subpackages (axgrid.spec.layout,
axgrid.perfmodel) import without torch.
"""
import importlib
import importlib.util

__version__ = "0.1.0"

# public name -> submodule that defines it; the subpackages nn, plans, checkpoint are public names themselves
_SOURCES = {
    "Communicator": "core.comm", "Ledger": "core.comm",
    "OverlapConfig": "core.config", "RuntimeConfig": "core.config",
    "clip_grad_norm_": "data_parallel.gradients", "finish_gradients": "data_parallel.gradients",
    "grad_norm": "data_parallel.gradients", "sync_gradients": "data_parallel.gradients",
    "local_batch": "data_parallel.gradients", "zero_gradients": "data_parallel.gradients",
    "ShardedOptimizer": "data_parallel.sharded_optimizer", "shard_optimizer": "data_parallel.sharded_optimizer",
    "adamw": "optimizer", "adamw_kind": "optimizer",
    "Grid": "core.grid", "current_grid": "core.grid", "Runtime": "core.runtime", "init": "core.runtime",
    "LaunchEnv": "launch.env", "detect_launch": "launch.env",
    "GridError": "spec.layout", "GridShape": "spec.layout", "RankLayout": "spec.layout",
    "generate": "generation",
    "dense_state_dict": "io.export", "iter_dense_state_dict": "io.export", "export_pretrained": "io.export",
    "to_dense": "io.export",
    "LoadReport": "io.pretrained", "PretrainedError": "io.hf_files", "from_pretrained": "io.pretrained",
    "LinearPlan": "plans.parallelize", "pair": "plans.parallelize", "parallelize": "plans.parallelize",
    "gather_tokens_features": "tensor_parallel.redistribute",
    "shard_tokens_features": "tensor_parallel.redistribute",
    "ParallelizeSummary": "plans.ties",
    "StepResult": "train", "train_step": "train",
    "check_replicas": "data_parallel.replicas",
    "LoraConfig": "adapters.lora", "lora": "adapters.lora", "merge_lora": "adapters.lora",
    "save_adapter": "adapters.peft_format", "load_adapter": "adapters.peft_format",
}

#: every public name: the table above plus the public subpackages (one list to edit when a name is added)
__all__ = [*_SOURCES, "nn", "plans"]


def __getattr__(name: str):
    """Load public `name` (or the submodule `name`, e.g. axgrid.models) on first access and keep it here."""
    if name in _SOURCES:
        value = getattr(importlib.import_module(f".{_SOURCES[name]}", __name__), name)
    elif not name.startswith("_") and importlib.util.find_spec(f".{name}", __name__) is not None:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'axgrid' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

