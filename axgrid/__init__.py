"""axgrid: Agarwal's 3D parallel matrix multiplication on a Gx x Gy x Gz x Gdata grid (the AxoNN algorithm).

    grid = axgrid.init("2x2x2x1")          # or axgrid.init(2, 2, 2)
    layer = axgrid.nn.Linear(1024, 4096)   # drop-in for nn.Linear
    model = axgrid.parallelize(model, grid)
    ...; loss.backward(); axgrid.sync_gradients(model, grid); opt.step()
    dense = axgrid.to_dense(model, grid)   # or axgrid.export_pretrained(hf_model, "out", grid)
"""
from . import checkpoint, nn, plans
from .comm import Communicator, Ledger
from .config import OverlapConfig, RuntimeConfig
from .data_parallel import clip_grad_norm_, finish_gradients, grad_norm, sync_gradients
from .grid import Grid, current_grid
from .launch import LaunchEnv, detect_launch
from .layout import GridError, GridShape, Layout
from .export import dense_state_dict, export_pretrained, to_dense
from .parallelize import LinearPlan, pair, parallelize
from .runtime import Runtime, init
from .redistribute import gather_tokens_features, shard_tokens_features
from .ties import ParallelizeSummary

__version__ = "0.1.0"
__all__ = ["init", "Grid", "GridShape", "GridError", "Layout", "RuntimeConfig", "OverlapConfig", "Communicator",
           "Ledger", "nn", "plans", "parallelize", "pair", "LinearPlan", "sync_gradients", "finish_gradients",
           "clip_grad_norm_", "grad_norm", "shard_tokens_features", "gather_tokens_features", "detect_launch",
           "LaunchEnv", "current_grid", "Runtime", "to_dense", "dense_state_dict", "export_pretrained", "ParallelizeSummary"]
