"""Which device a rank computes on, and which collective backend goes with it.

- :func:`gpu_index`: a rank's GPU from its local rank and the GPUs its process sees. One visible GPU is the rank's
  own (``srun --gpus-per-task=1``, ``--gpu-bind=closest``, a per-rank ``CUDA_VISIBLE_DEVICES``); otherwise local
  rank i takes GPU i, and more ranks on a node than GPUs is refused, never wrapped around onto a shared GPU.
- :func:`choose_device`: the device of a rank that creates the job's process group (the GPU of its local rank
  under NCCL/RCCL, made current before the group exists), or of a rank joining a group the program created
  itself (the group's bound device, the current GPU the program chose, else the local rank's).
- :func:`backend_device_type`: what a backend's collectives run on. ``torch.distributed.get_backend`` may say
  "nccl", "cuda:nccl,cpu:gloo" or "undefined" (a group created without naming a backend): matching the string
  "nccl" alone misses the last two.
"""
from __future__ import annotations

import os
from typing import Optional, Union

import torch

from ..launch.env import LaunchEnv, LaunchError
from . import cuda
from .base import CpuDevice, Device

#: Collective backends whose tensors live on GPUs (RCCL answers to "nccl" on ROCm builds).
GPU_BACKENDS = ("nccl", "rccl", "xccl")
#: Host backends.
CPU_BACKENDS = ("gloo", "mpi", "ucc")


def backend_device_type(backend: str) -> Optional[str]:
    """"cuda" when ``backend`` runs collectives on GPUs, "cpu" for host backends, None when the name does not say
    (a dry run's "fake", or "undefined": a default group whose backend follows the tensors)."""
    b = backend.lower()
    if any(name in b for name in GPU_BACKENDS) or "cuda:" in b:
        return "cuda"
    if b in CPU_BACKENDS:
        return "cpu"
    return None


def default_backend() -> str:
    """NCCL where this process sees a GPU (RCCL under the same name on ROCm), gloo otherwise."""
    return "nccl" if cuda.count() > 0 else "gloo"


def _visible_what() -> str:
    for var in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        if var in os.environ:
            return f"{var}={os.environ[var]!r}"
    return "no *_VISIBLE_DEVICES set"


def gpu_index(local_rank: int, local_world_size: int, visible: int) -> int:
    """The GPU (index among the ``visible`` ones) of local rank ``local_rank`` of ``local_world_size`` on its node;
    a :class:`~axgrid.launch.env.LaunchError` naming the counts when there is none for it."""
    if visible < 1:
        raise LaunchError(f"local rank {local_rank} asks for a GPU, but this process sees none ({_visible_what()}); "
                          f"use backend='gloo' on CPUs, or check the job's GPU request (srun --gpus-per-task=1)")
    if visible == 1:
        return 0            # bound to one GPU of its own (or the node has one: NCCL refuses a GPU used twice)
    if local_rank >= visible or local_world_size > visible:
        raise LaunchError(f"local rank {local_rank} of {local_world_size} ranks on this node, but this process sees "
                          f"{visible} GPUs ({_visible_what()}): start one rank per GPU (srun --ntasks-per-node="
                          f"{visible}, or --gpus-per-task=1 so each rank sees its own), never several per GPU")
    return local_rank


def of(device: Union[str, torch.device]) -> Device:
    """The :class:`~axgrid.device.base.Device` that talks to ``device`` ("cpu", "cuda", "cuda:3")."""
    device = torch.device(device)
    if device.type == "cpu":
        return CpuDevice(device)
    if device.type == "cuda":
        return cuda.RocmDevice(device) if cuda.is_rocm() else cuda.CudaDevice(device)
    raise ValueError(f"axgrid runs on cpu and cuda devices (ROCm GPUs are cuda devices to torch), not {device}; "
                     f"for a dry run use axgrid.dryrun.harness")


def choose_device(launch: LaunchEnv, backend: str, device: Union[None, str, torch.device] = None,
                  joining: bool = False) -> torch.device:
    """This rank's device for ``backend``: ``device`` when given (made current when a GPU); else for a GPU backend
    the local rank's GPU (:func:`gpu_index`), made current. ``joining`` (the program created the process group):
    the group's bound device, or the current GPU when the program already chose one other than GPU 0, come first.
    A backend that does not say what it runs on (:func:`backend_device_type` None) gets a GPU when one is
    visible, else the CPU."""
    if device is not None:
        device = torch.device(device)
        if device.type == "cuda" and cuda.count() > 0:
            cuda.set_current(device.index if device.index is not None else cuda.current_index())
            device = torch.device("cuda", cuda.current_index())
        return device
    kind = backend_device_type(backend)
    if kind is None:
        kind = "cuda" if cuda.count() > 0 else "cpu"
    if kind == "cpu":
        return torch.device("cpu")
    if joining:
        bound = _bound_device()
        if bound is not None:
            cuda.set_current(bound.index)
            return bound
        if cuda.count() > 0 and cuda.current_index() != 0:
            return torch.device("cuda", cuda.current_index())      # the program set it before creating the group
    index = gpu_index(launch.local_rank, launch.local_world_size, cuda.count())
    cuda.set_current(index)
    return torch.device("cuda", index)


def _bound_device() -> Optional[torch.device]:
    """The device the program's default process group was bound to (``init_process_group(device_id=...)``)."""
    import torch.distributed as dist
    group = dist.distributed_c10d._get_default_group() if dist.is_initialized() else None
    bound = getattr(group, "bound_device_id", None)
    return bound if isinstance(bound, torch.device) and bound.type == "cuda" else None
