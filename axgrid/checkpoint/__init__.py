"""Sharded, reshardable, atomic checkpoints of a model and its optimizer.

A checkpoint saved on one grid loads on any other grid (or into the serial model, ``grid=None``) built with
the same sizes: every tensor is written as the rectangular tiles of its *dense* form that the ranks hold
(:class:`axgrid.sharding.TileSpec`), and a loading rank assembles its own tile from the saved tiles that
overlap it, then cuts its part with ``TileSpec.part_of``.

Layout on disk (``root`` is what you pass to :class:`CheckpointManager` / :func:`save_checkpoint`)::

    root/
      latest                    one line: the name of the newest complete checkpoint (replaced atomically)
      step-00000100/
        manifest.json           format, version, step, grid, order, world size, per tensor its dense shape,
                                dtype and tiles (file, key, offsets, shape), per file its size and sha256,
                                optimizer class and hyper-parameters, user ``extra`` (e.g. data position)
        rank-00000.pt           torch.save({"tensors": {key: tile}, "rng": {...}}) of plain tensors/dicts
        rank-00001.pt           ...one per rank (every rank saves its RNG state; tiles only by their writer)

Which rank writes a tile: a parameter's data is a tile of the dense tensor, possibly flattened and split over
``split_dim`` (z). The split tile is all-gathered over z (through ``grid.comm``), and exactly one rank per
distinct tile writes it: the one whose coordinate is 0 along the split dimension and along every letter of
``param.axgrid_replicated``. Dense parameters (no tile) and scalar optimizer state (AdamW's ``step``) are
written once, by rank 0. Optimizer tensors with the parameter's shape (``exp_avg``, ``exp_avg_sq``,
momentum buffers) share the parameter's tile.

Atomicity: all ranks write into ``root/step-XXXXXXXX.tmp-<random>``; after every rank reported success (an
all-reduce of a flag over "xyz" then "d"), rank 0 writes the manifest, renames the directory to its final name
and replaces ``latest`` with ``os.replace``. An interrupted or failed save leaves ``latest`` and the earlier
checkpoints untouched; older checkpoints beyond ``keep`` are removed only after the new one is complete.

Loading reads only the manifest and the files holding overlapping tiles (``torch.load(weights_only=True)``),
checks every file's size on every rank and the sha256 of every file it reads, and posts no collective before
one agreement all-reduce: a damaged or mismatched checkpoint raises :class:`CheckpointError` on every rank,
naming the file and the fix, and leaves the model, the optimizer and the files untouched.

Save-on-signal: :class:`SaveOnSignal` turns SIGTERM / SIGUSR1 (Slurm's ``--signal=USR1@120``) into a flag that
all ranks agree on at a step boundary, so the job saves and exits cleanly before its time limit.

    ckpt = CheckpointManager("ckpt", grid, keep=2)
    info = ckpt.resume(model, opt, generators={"data": gen})       # None on a fresh start
    with SaveOnSignal(grid) as stop:
        for step in range(info.step if info else 0, steps):
            train_step()
            if (step + 1) % 100 == 0 or stop.should_stop():
                ckpt.save(step + 1, model, opt, extra={"tokens_seen": ...}, generators={"data": gen})
                if stop.stopped:
                    break
"""
from __future__ import annotations

from .format import FORMAT, LATEST, MANIFEST, VERSION, CheckpointError, LoadInfo
from .load import load_checkpoint
from .manager import CheckpointManager
from .save import save_checkpoint
from .signals import SaveOnSignal
from .store import latest_checkpoint, list_checkpoints, resolve_checkpoint, verify_checkpoint

__all__ = ["CheckpointError", "LoadInfo", "save_checkpoint", "load_checkpoint", "latest_checkpoint",
           "list_checkpoints", "resolve_checkpoint", "verify_checkpoint", "CheckpointManager", "SaveOnSignal"]
