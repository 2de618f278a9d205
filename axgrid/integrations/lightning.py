"""axgrid as a Lightning Fabric strategy: a Fabric training loop gets the Gx x Gy x Gz x Gd grid by changing one
argument.

    fabric = Fabric(accelerator="cpu", devices=8, strategy=AxgridStrategy("2x2x2x1", zero=1, overlap="all"))
    fabric.launch()                                    # Fabric's launcher, torchrun or srun
    model, opt = fabric.setup(model, opt)              # parallelized on the grid, the optimizer sharded over d
    loader = fabric.setup_dataloaders(loader)          # every rank of one d-group reads the same batches

What each Fabric call becomes (everything else is Fabric's own):

=================================  ===============================================================================
Fabric                             axgrid
=================================  ===============================================================================
``Fabric(strategy=...)``           in every process, before any process group: the precision is one of
                                   :data:`SUPPORTED_PRECISION`, and Fabric's cluster environment agrees with
                                   axgrid's launch table (:func:`axgrid.launch.env.read_placement`) on who started
                                   this process and its rank, world size and local rank, and ``devices`` x
                                   ``num_nodes`` is the world; else one line (an srun task of an
                                   ``interactive``/``bash`` job, which Fabric leaves to its own launcher, runs as
                                   the srun task it is: ``AxgridStrategy._agree_with_launch_table``)
``fabric.launch()``                Fabric's cluster environment (its launcher's processes, torchrun's
                                   ``TorchElasticEnvironment``, srun's ``SLURMEnvironment``, MPI) initialises the
                                   default process group (gloo on CPU, NCCL on GPUs), then :func:`axgrid.init`
                                   builds the grid on it (``grid``, ``order``, ``config``)
``fabric.setup(model, opt)``       :func:`axgrid.parallelize` (the built-in plan of a Hugging Face family, else
                                   drop-in ``axgrid.nn.Linear``; ``plan=`` as there; a model already parallel, e.g.
                                   axgrid's GPT or ``axgrid.from_pretrained``, is kept), ``grid.watch`` (the
                                   data-parallel buckets, so the first backward reduces over d); the optimizer's
                                   groups point at the parallel parameters (same names), then
                                   :func:`axgrid.shard_optimizer` (``zero`` >= 1: its state sharded over d)
``fabric.setup_dataloaders``       a ``DistributedSampler`` over d only: ``num_replicas=Gd``, ``rank`` = the d
                                   coordinate, so the x·y·z ranks of one d-group get the same batch (the model
                                   splits it over z inside); its batch size is the d-rank's, ``B/Gd``
``fabric.backward(loss)``          ``loss.backward()``: axgrid's end of the backward reduces the gradients over d
                                   (DDP's semantics, docs/training.md)
``fabric.no_backward_sync``        ``grid.no_sync()`` (a no-op with ``zero=2``, as there)
``optimizer.step()``               :func:`axgrid.sync_gradients` (completes what is in flight), then the step (a
                                   sharded step all-gathers the parameters over d)
``fabric.clip_gradients``          ``max_norm``: :func:`axgrid.clip_grad_norm_`, the global norm over the grid;
                                   ``clip_val``: a clamp of the gradients the optimizer steps
``fabric.save(path, state)``       :func:`axgrid.checkpoint.save_checkpoint` into the root ``path``
                                   (``path/step-N``, ``N`` = ``state["step"]`` or 0, and ``path/latest``): the one
                                   model, the one optimizer, ``torch.Generator`` values, and every other entry as
                                   JSON ``extra`` (a scheduler's or other object's ``state_dict()``); reshardable:
                                   it loads on another grid, Gd or ``zero``
``fabric.load(path, state)``       :func:`axgrid.checkpoint.load_checkpoint` (a root or a ``step-N`` folder) into
                                   the model, optimizer and generators; the other entries come back from ``extra``
                                   (into ``state``, or an object's ``load_state_dict``), the rest is returned
``all_reduce`` / ``all_gather`` /  torch.distributed over the world, as Fabric's other parallel strategies
``barrier`` / ``broadcast``
=================================  ===============================================================================

Not supported, with a one-line error: a precision other than ``"32-true"``, ``"bf16-mixed"`` (autocast) and
``"bf16-true"`` (bf16 weights) -- ``"16-mixed"``'s gradient scaler would decide on each rank alone whether to step,
``"16-true"`` overflows without one --, ``fabric.save(filter=...)``,
``storage_options``, loading a whole checkpoint without a model (``fabric.load(path)``), an optimizer that has
stepped before ``fabric.setup``, and ``fabric.setup(..., scheduler=...)`` with ``zero`` >= 1 (the sharded optimizer
is a new object: build the scheduler on the optimizer ``fabric.setup`` returns). Worker seeding of data loaders is
Fabric's (by global rank): random augmentations in workers then differ between the ranks of a d-group.

Why a strategy of our own: Fabric's ``ModelParallelStrategy`` takes a 2-D DeviceMesh and FSDP2/DTensor
parallelism; axgrid's layers, buckets, sharded optimizer and box checkpoints are a different mechanism, so the
strategy is the seam where Fabric's calls meet axgrid's public functions. Needs ``lightning-fabric``
(``pip install axgrid[lightning]``).
"""
from __future__ import annotations

import json
import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from lightning_fabric.accelerators import Accelerator
from lightning_fabric.plugins.environments import (ClusterEnvironment, LightningEnvironment, MPIEnvironment,
                                                   SLURMEnvironment, TorchElasticEnvironment)
from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning_fabric.plugins.precision import Precision
from lightning_fabric.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning_fabric.strategies.parallel import ParallelStrategy
from lightning_fabric.strategies.strategy import TBroadcast, _BackwardSyncControl
from lightning_fabric.utilities.distributed import (ReduceOp, _get_default_process_group_backend_for_device,
                                                    _init_dist_connection, _sync_ddp_if_available)
from lightning_fabric.utilities.rank_zero import rank_zero_only
from lightning_fabric.utilities.seed import reset_seed

from ..checkpoint import CheckpointError, load_checkpoint, read_manifest, save_checkpoint
from ..core.config import RuntimeConfig
from ..data_parallel.gradients import clip_grad_norm_, sync_gradients
from ..core.grid import Grid
from ..io import raise_on_any_rank
from ..launch.env import MPI_LAUNCHERS, LaunchError, Placement, read_placement
from ..plans.parallelize import parallelize
from ..core.runtime import init
from ..data_parallel.sharded_optimizer import shard_optimizer
from ..spec import OverlapConfig
from ..spec.layout import GridShape


#: Fabric's ``precision`` values AxgridStrategy trains with, each checked against axgrid's own loop under the same
#: precision (tests/scripts/test_examples.py).
SUPPORTED_PRECISION = ("32-true", "bf16-mixed", "bf16-true")
#: Why the others are refused (the rest: no test shows they train).
_WHY_NOT = {"16-mixed": "its gradient scaler would skip steps on each rank alone",
            "16-true": "fp16 without loss scaling: the gradients overflow"}


def _is_parallel(model: nn.Module) -> bool:
    """Whether ``model`` is parallel already: parallelized, loaded by ``axgrid.from_pretrained``, or built of axgrid
    layers (axgrid's GPT): its parameters carry the grid letters they are replicated over."""
    return hasattr(model, "axgrid_summary") or any(hasattr(p, "axgrid_replicated") for p in model.parameters())


def _stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


class AxgridStrategy(ParallelStrategy):
    """Lightning Fabric's strategy for axgrid's grid (see the module docstring for what each Fabric call does).

    ``grid``: the grid, as :func:`axgrid.init` takes it (``"2x2x2x1"``, or ``"2x2x2"`` with Gd inferred from the
    world size); ``order`` its rank order. ``config``: the :class:`~axgrid.RuntimeConfig` (timeouts, buckets, GEMM,
    seed, ...); ``zero`` and ``overlap`` (``"all"``, ``"oar,odp"``, ``"none"`` or an :class:`~axgrid.OverlapConfig`)
    replace its fields when given. ``plan``: what :func:`axgrid.parallelize` applies (None: the built-in plan, else
    drop-in; ``{}``: drop-in). ``process_group_backend``: None picks Fabric's default for the device (gloo on
    CPU, NCCL on GPUs). ``grid`` (the property): the :class:`~axgrid.Grid`, once ``fabric.launch()`` ran.
    """

    def __init__(self, grid: Union[str, GridShape], *, zero: Optional[int] = None,
                 overlap: Union[None, str, OverlapConfig] = None, order: str = "xyzd",
                 config: Optional[RuntimeConfig] = None, plan: Any = None,
                 process_group_backend: Optional[str] = None, accelerator: Optional[Accelerator] = None,
                 parallel_devices: Optional[list[torch.device]] = None,
                 cluster_environment: Optional[ClusterEnvironment] = None,
                 precision: Optional[Precision] = None) -> None:
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=cluster_environment, precision=precision)
        config = config or RuntimeConfig()
        if zero is not None:
            config = replace(config, zero=zero)                       # RuntimeConfig checks the value
        if overlap is not None:
            if not isinstance(overlap, (str, OverlapConfig)):
                raise ValueError(f"AxgridStrategy(overlap={overlap!r}): give 'all', 'none', names such as "
                                 f"'oar,odp', or an axgrid.OverlapConfig")
            config = replace(config, overlap=OverlapConfig.parse(overlap) if isinstance(overlap, str) else overlap)
        self.config = config
        self.grid_spec, self.order, self.plan = grid, order, plan
        self._process_group_backend = process_group_backend
        self._num_nodes = 1
        self._grid: Optional[Grid] = None
        self._model: Optional[nn.Module] = None
        self._backward_sync_control = _GridNoSync(self)

    # -- where the processes are -------------------------------------------------------------------------------
    @property
    def grid(self) -> Grid:
        if self._grid is None:
            raise RuntimeError("AxgridStrategy.grid: the grid is built by fabric.launch(); call it first")
        return self._grid

    @property
    def root_device(self) -> torch.device:
        assert self.parallel_devices is not None
        return self.parallel_devices[self.local_rank]

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        self._num_nodes = num_nodes

    @property
    def num_processes(self) -> int:
        return len(self.parallel_devices) if self.parallel_devices is not None else 0

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        """Samplers split the data over d only: every x·y·z rank of one d-group reads the same samples."""
        return {"num_replicas": self.grid.size("d"), "rank": self.grid.index("d")}

    @property
    def checkpoint_io(self) -> CheckpointIO:
        raise NotImplementedError("AxgridStrategy writes axgrid's checkpoints (axgrid.checkpoint), not through a "
                                  "CheckpointIO plugin")

    @checkpoint_io.setter
    def checkpoint_io(self, io: CheckpointIO) -> None:
        if io is not None:
            raise NotImplementedError("AxgridStrategy writes axgrid's checkpoints (axgrid.checkpoint); remove the "
                                      "CheckpointIO plugin")

    def _configure_launcher(self) -> None:
        """In ``Fabric(...)``, in every process, before Fabric's launcher starts any: the precision and the launch
        are checked (one line, before any process group), then Fabric's launcher is made if it starts the
        processes."""
        self._check_precision()
        self._agree_with_launch_table()
        assert self.cluster_environment is not None
        if not self.cluster_environment.creates_processes_externally:
            self._launcher = _SubprocessScriptLauncher(self.cluster_environment, self.num_processes, self.num_nodes)

    def _set_world_ranks(self) -> None:
        if self.cluster_environment is not None:
            self.cluster_environment.set_global_rank(self.node_rank * self.num_processes + self.local_rank)
            self.cluster_environment.set_world_size(self.num_nodes * self.num_processes)
        rank_zero_only.rank = self.global_rank

    def _check_precision(self) -> None:
        value = getattr(self.precision, "precision", None)
        if value not in SUPPORTED_PRECISION or getattr(self.precision, "scaler", None) is not None:
            why = f" ({_WHY_NOT[value]})" if value in _WHY_NOT else ""
            raise ValueError(f"AxgridStrategy: precision={value!r} is not supported{why}; use one of "
                             f"{', '.join(map(repr, SUPPORTED_PRECISION))}")

    def _agree_with_launch_table(self) -> None:
        """Fabric's cluster environment and axgrid's launch table (:func:`axgrid.launch.env.read_placement`) must
        describe this process alike, or the job would hang or train several worlds side by side; checked from the
        launchers' variables alone (the same verdict on every rank), before any process group.

        One disagreement is corrected: an srun task of a step of several whose job is named ``interactive`` or
        ``bash`` (``srun --pty bash`` allocations, ``srun ... bash -c``), which Fabric leaves to its own launcher
        (that would start ``devices`` processes in every task, each task a world of its own), runs as the srun
        task it is (Fabric's :class:`SLURMEnvironment`). Every other one raises :class:`LaunchError`: a batch
        script's own step that Fabric takes for an srun task (no ``srun`` before ``python``), an MPI launcher's
        ranks that Fabric reads from Slurm's variables (mpiexec inside ``sbatch``), ranks whose number is not
        ``devices`` x ``num_nodes``."""
        env = self.cluster_environment
        assert env is not None
        placed = read_placement(os.environ)
        where = (f"axgrid's launch table finds {_placed(placed)} (axgrid.launch.env.read_placement); Fabric "
                 f"chose {type(env).__name__}")
        if not env.creates_processes_externally:
            if placed.world_size == 1:
                return                                  # one process: Fabric's launcher starts the rest
            if placed.launcher == "slurm" and isinstance(env, LightningEnvironment):
                self.cluster_environment = env = SLURMEnvironment()
                self._set_world_ranks()
            else:
                raise LaunchError(f"{where}, whose launcher would start {self.num_processes} processes in each of "
                                  f"these {placed.world_size}: give AxgridStrategy(cluster_environment=...) for "
                                  f"{placed.launcher}, or start the ranks with torchrun or srun", rank=placed.rank)
        elif isinstance(env, LightningEnvironment) and placed.launcher != "torchrun":
            return                                      # a process Fabric's own launcher started (no RANK)
        expected = next((rows for kind, rows in _LAUNCHERS_OF.items() if isinstance(env, kind)), None)
        if expected is None and placed.launcher == "single":
            return                                      # an environment of a launcher the table does not know (LSF)
        fabric = (env.global_rank(), env.world_size(), env.local_rank())
        if placed.launcher == "single" or (expected is not None and placed.launcher not in expected):
            fix = f"give AxgridStrategy(cluster_environment=...) for {placed.launcher}"
            if isinstance(env, SLURMEnvironment):
                fix = ("start it with srun (srun --ntasks-per-node=N python ...)" if placed.launcher == "single" else
                       f"start the ranks with srun instead of {placed.launcher}, or {fix}")
            raise LaunchError(f"{where}, which reads this process as rank {fabric[0]} of {fabric[1]}: {fix}",
                              rank=placed.rank)
        if fabric != (placed.rank, placed.world_size, placed.local_rank):
            raise LaunchError(f"{where}, which reads this process as rank {fabric[0]} of {fabric[1]}, local rank "
                              f"{fabric[2]}: start the ranks with one launcher, or give AxgridStrategy("
                              f"cluster_environment=...) that reads {placed.launcher}'s", rank=placed.rank)
        if placed.world_size != self.num_nodes * self.num_processes:
            raise LaunchError(f"Fabric(devices={self.num_processes}, num_nodes={self.num_nodes}) makes "
                              f"{self.num_nodes * self.num_processes} ranks, but {placed.launcher} started "
                              f"{placed.world_size} ({placed.local_world_size} on this node): set devices="
                              f"{placed.local_world_size} and num_nodes={placed.world_size // placed.local_world_size}",
                              rank=placed.rank)

    def setup_environment(self) -> None:
        """In every process, before any communication: the default process group from Fabric's cluster
        environment, then the grid on it."""
        super().setup_environment()
        reset_seed()
        self._set_world_ranks()
        assert self.cluster_environment is not None
        backend = self._process_group_backend or _get_default_process_group_backend_for_device(self.root_device)
        _init_dist_connection(self.cluster_environment, backend, timeout=timedelta(seconds=self.config.timeout_s))
        self._grid = init(self.grid_spec, order=self.order, config=self.config, device=self.root_device)

    # -- model and optimizer -----------------------------------------------------------------------------------
    def setup_module(self, module: nn.Module) -> nn.Module:
        """Parallelize ``module`` on the grid (unless it is parallel already) and build its data-parallel
        buckets."""
        if not _is_parallel(module):
            parallelize(module, self.grid, self.plan)
        self.grid.watch(module)
        self._model = module
        return module

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """The optimizer over the parallel model's parameters, its state sharded over d as ``zero`` says."""
        if self._model is None:
            raise RuntimeError("AxgridStrategy: set the model up first (fabric.setup(model, optimizer), or "
                               "fabric.setup_module(model) before fabric.setup_optimizers(optimizer))")
        return shard_optimizer(optimizer, self._model, self.grid)

    def setup_module_and_optimizers(self, module: nn.Module, optimizers: list[Optimizer],
                                    scheduler: Optional[Any] = None) -> tuple[nn.Module, list[Optimizer], Any]:
        """Parallelize ``module``, point the optimizers' groups at its parallel parameters (the same names; built
        before ``setup``, they held the dense ones), and shard them."""
        names = {id(p): n for n, p in module.named_parameters(remove_duplicate=False)}
        for i, opt in enumerate(optimizers):
            if any(opt.state.values()):
                raise ValueError(f"fabric.setup: optimizer {i} ({type(opt).__name__}) has stepped already; set it "
                                 f"up before its first step (load checkpoints with fabric.load after setup)")
            for g in opt.param_groups:
                if any(id(p) not in names for p in g["params"]):
                    raise ValueError(f"fabric.setup: optimizer {i} ({type(opt).__name__}) holds a tensor that is "
                                     f"not a parameter of the model; build it from model.parameters()")
        if scheduler is not None and self.config.zero:
            raise ValueError(f"fabric.setup(..., scheduler=...) with zero={self.config.zero}: the sharded optimizer "
                             f"is a new object; build the scheduler on the optimizer fabric.setup returns")
        module = self.setup_module(module)
        now = dict(module.named_parameters(remove_duplicate=False))
        for opt in optimizers:
            for g in opt.param_groups:
                g["params"] = [now[names[id(p)]] for p in g["params"]]
        return module, [self.setup_optimizer(opt) for opt in optimizers], scheduler

    def module_to_device(self, module: nn.Module) -> None:
        """Nothing: :func:`axgrid.parallelize` puts each rank's parts on the grid's device (no dense copy
        there)."""

    # -- a step ------------------------------------------------------------------------------------------------
    def optimizer_step(self, optimizer: Any, **kwargs: Any) -> Any:
        if self._model is not None:
            sync_gradients(self._model, self.grid)
        return self.precision.optimizer_step(optimizer, **kwargs)

    def clip_gradients_norm(self, module: nn.Module, optimizer: Optimizer, max_norm: Union[float, int],
                            norm_type: Union[float, int] = 2.0, error_if_nonfinite: bool = True) -> torch.Tensor:
        """The global gradient norm over the grid (every element counted once), clipped to ``max_norm``."""
        self.precision.unscale_gradients(optimizer)
        sync_gradients(module, self.grid)
        norm = clip_grad_norm_(module, float(max_norm), self.grid, float(norm_type))
        if error_if_nonfinite and not bool(torch.isfinite(norm)):
            raise RuntimeError(f"the total norm of order {norm_type} of the gradients is {float(norm)}: not finite "
                               f"(the same on every rank); pass error_if_nonfinite=False to clip anyway")
        return norm

    def clip_gradients_value(self, module: nn.Module, optimizer: Optimizer, clip_val: Union[float, int]) -> None:
        """Each gradient element the optimizer steps (``zero`` >= 1: this d-rank's pieces) into
        ``[-clip_val, clip_val]``."""
        self.precision.unscale_gradients(optimizer)
        sync_gradients(module, self.grid)
        for g in optimizer.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    p.grad.detach().clamp_(-clip_val, clip_val)

    # -- collectives over the world ----------------------------------------------------------------------------
    def all_reduce(self, tensor: Any, group: Optional[Any] = None,
                   reduce_op: Optional[Union[ReduceOp, str]] = "mean") -> Any:
        if isinstance(tensor, torch.Tensor):
            return _sync_ddp_if_available(tensor, group, reduce_op=reduce_op)
        return tensor

    def all_gather(self, tensor: torch.Tensor, group: Optional[Any] = None, sync_grads: bool = False) -> torch.Tensor:
        """Every rank's ``tensor``, stacked: ``[world, *tensor.shape]`` (``sync_grads``: Fabric's, which
        backpropagates through torch.distributed.nn and warns that it is deprecated)."""
        if sync_grads or not dist.is_initialized():
            return super().all_gather(tensor, group, sync_grads)
        out = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
        dist.all_gather(out, tensor.contiguous(), group=group)
        return torch.stack(out)

    def barrier(self, name: Optional[str] = None) -> None:
        if dist.is_initialized():
            dist.barrier()

    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        if not dist.is_initialized():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src)
        return box[0]

    # -- checkpoints -------------------------------------------------------------------------------------------
    def save_checkpoint(self, path: Union[str, Path], state: dict[str, Any], storage_options: Optional[Any] = None,
                        filter: Optional[dict[str, Callable[[str, Any], bool]]] = None) -> None:
        """``state`` as an axgrid checkpoint ``path/step-N`` (``N``: ``state["step"]``, else 0), ``path/latest``
        pointing at it; earlier steps are kept. Collective."""
        if storage_options is not None or filter is not None:
            raise ValueError("fabric.save with AxgridStrategy takes no storage_options or filter: an axgrid "
                             "checkpoint holds the whole model and optimizer")
        model, opt, gens, rest = _split(state, "fabric.save")
        extra = {k: v.state_dict() if _stateful(v) else v for k, v in rest.items()}
        for k, v in extra.items():
            try:
                json.dumps(v)
            except (TypeError, ValueError):
                raise ValueError(f"fabric.save: state[{k!r}] ({type(rest[k]).__name__}) is not JSON-serialisable; "
                                 f"an axgrid checkpoint holds the model, the optimizer, torch.Generators and JSON "
                                 f"values (numbers, strings, lists, dicts)") from None
        step = extra.get("step", 0)
        step = step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else 0
        save_checkpoint(str(path), model, opt, self.grid, step=step, extra=extra, generators=gens, keep=None)

    def load_checkpoint(self, path: Union[str, Path],
                        state: Optional[Union[nn.Module, Optimizer, dict[str, Any]]] = None, strict: bool = True,
                        weights_only: Optional[bool] = None) -> dict[str, Any]:
        """Restore ``state``'s model, optimizer and generators from the axgrid checkpoint at ``path`` (a root or a
        ``step-N`` folder) on this grid (any grid it was saved on), and its other entries from the saved ``extra``;
        returns the saved entries ``state`` did not ask for. Collective."""
        if isinstance(state, nn.Module):
            load_checkpoint(str(path), state, None, self.grid, strict=strict)
            return {}
        if not state or isinstance(state, Optimizer):
            raise ValueError("fabric.load with AxgridStrategy needs state={'model': model, ...} (the objects to load "
                             "into): an axgrid checkpoint is read into the parallel model, never whole")
        model, opt, gens, rest = _split(state, "fabric.load")
        err: Optional[Exception] = None
        try:
            saved = dict(read_manifest(str(path)).get("extra") or {})
            missing = [k for k in rest if k not in saved]
            if strict and missing:
                raise KeyError(f"fabric.load: the checkpoint {path} holds no {missing[0]!r} (it holds "
                               f"{sorted(saved)}); save it with fabric.save, or pass strict=False")
        except (KeyError, CheckpointError) as e:
            err = e
        raise_on_any_rank(self.grid, err, lambda n: CheckpointError(
            f"{n} rank(s) could not read the checkpoint {path} (see their errors); nothing was changed"))
        info = load_checkpoint(str(path), model, opt, self.grid, generators=gens, strict=strict)
        extra = dict(info.extra)
        for k, obj in rest.items():
            if k in extra:
                if _stateful(obj):
                    obj.load_state_dict(extra.pop(k))
                else:
                    state[k] = extra.pop(k)
        return extra

    def teardown(self) -> None:
        """Release the grid (its groups; the default group stays Fabric's), then Fabric's own teardown."""
        if self._grid is not None:
            self._grid.destroy()
            self._grid = None
        if self.cluster_environment is not None:
            self.cluster_environment.teardown()
        self.precision.teardown()
        if self.accelerator is not None:
            self.accelerator.teardown()


class _GridNoSync(_BackwardSyncControl):
    """``fabric.no_backward_sync``: the grid's ``no_sync`` (backward passes accumulate without reducing over d)."""

    def __init__(self, strategy: AxgridStrategy) -> None:
        self.strategy = strategy

    def no_backward_sync(self, module: nn.Module, enabled: bool) -> AbstractContextManager:
        return self.strategy.grid.no_sync() if enabled else nullcontext()


#: The rows of axgrid's launch table (axgrid.launch.env.LAUNCHERS) each of Fabric's cluster environments reads.
_LAUNCHERS_OF: dict[type, tuple[str, ...]] = {TorchElasticEnvironment: ("torchrun",), SLURMEnvironment: ("slurm",),
                                              LightningEnvironment: ("torchrun",), MPIEnvironment: MPI_LAUNCHERS}


def _placed(p: Placement) -> str:
    if p.launcher == "single":
        return "no launcher (one process on its own)"
    return f"{p.launcher}'s rank {p.rank} of {p.world_size}, local rank {p.local_rank} of {p.local_world_size}"


def _split(state: dict[str, Any], what: str
           ) -> tuple[nn.Module, Optional[Optimizer], Optional[dict[str, torch.Generator]], dict[str, Any]]:
    """``state``'s one model, at most one optimizer, its generators, and the rest (raises on every rank alike,
    before any collective, for more than one model or optimizer, or none)."""
    models = [k for k, v in state.items() if isinstance(v, nn.Module)]
    opts = [k for k, v in state.items() if isinstance(v, Optimizer)]
    if len(models) != 1 or len(opts) > 1:
        raise ValueError(f"{what}: an axgrid checkpoint holds one model and at most one optimizer; state has "
                         f"model(s) {models} and optimizer(s) {opts}")
    gens = {k: v for k, v in state.items() if isinstance(v, torch.Generator)}
    rest = {k: v for k, v in state.items() if k not in models and k not in opts and k not in gens}
    return state[models[0]], state[opts[0]] if opts else None, gens or None, rest


__all__ = ["AxgridStrategy"]
