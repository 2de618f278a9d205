"""Sharded, reshardable, atomic checkpoints of a model and its optimizer.

A checkpoint saved on one grid loads on any other grid (or into the serial model, ``grid=None``) built with
the same sizes: every tensor is written as rectangles (boxes) of its *dense* form -- each rank's own part, as
:func:`axgrid.spec.tiles.part_boxes` gives it -- and a loading rank reads, for each box of its own part, only the
overlapping pieces of the saved boxes. Memory stays bounded: saving posts no gather and writes the rank's parts
straight from the parameters into the file; loading holds the rank's parts plus one box in flight.

Layout on disk (``root`` is what you pass to :class:`CheckpointManager` / :func:`save_checkpoint`)::

    root/
      latest                    one line: the name of the newest complete checkpoint (replaced atomically)
      step-00000100/
        manifest.json           format, version, step, grid, order, world size, zero, per tensor its dense shape,
                                dtype and tiles (file, key, offsets, shape), per file its size and sha256,
                                optimizer class and hyper-parameters, user ``extra`` (e.g. data position),
                                the run ``config`` (compared on resume)
        rank-00000.pt           torch.save({"tensors": {key: box}, "rng": {...}}) of plain tensors/dicts
        rank-00001.pt           ...one per rank (every rank saves its RNG state; boxes only by their writer)

Which rank writes a part: exactly one rank per distinct part, the one whose coordinate is 0 along every letter
of ``param.axgrid_replicated`` (a Linear weight's z-parts are distinct, so every z-rank writes its own, as 1-3
boxes; a part that is only padding writes nothing). A mixture of experts' experts (``axgrid_expert``, named by
global id, each e-rank holding others) are written by the first rank of their replica group ``"r"`` instead, and
marked ``"expert"`` in the manifest: a model under another ``ep`` loads the experts it holds. Dense parameters (no tile) and scalar optimizer state
(AdamW's ``step``) are written once, by rank 0. Optimizer tensors with the parameter's shape (``exp_avg``,
``exp_avg_sq``, momentum buffers) share the parameter's tile; those of an optimizer sharded over d
(``axgrid.ShardedOptimizer``, ``zero`` >= 1) have their piece's (the parameter's tile with ``piece``: each
d-rank writes its own flat range of the part), so they too load on any grid, any Gd and any ``zero`` mode.
Checkpoints of older axgrid versions, which saved whole z-gathered tiles, are rectangles too and load unchanged
(format version 1 either way).

Atomicity: all ranks write into ``root/step-XXXXXXXX.tmp-<random>``; after every rank reported success (an
all-reduce of a flag over "xyz" then "d"), rank 0 writes the manifest, renames the directory to its final name
and replaces ``latest`` with ``os.replace``. Saving a step that exists already moves the new rank files into it
under fresh names and then replaces its manifest in one ``os.replace`` (the commit), so the step directory holds
one complete checkpoint at every moment and ``latest`` never names a missing one, however the process dies. An
interrupted or failed save leaves ``latest`` and the earlier checkpoints untouched; a failed save removes its
files, and each save first removes what saves killed on the way left (``*.tmp-*``, uncommitted rank files).
Older checkpoints beyond ``keep`` are removed only after the new one is complete.

Trust: ``latest`` must hold a plain ``step-N`` name and every file the manifest names must be a plain file name;
nothing (also no symlink) may lead outside the root or the checkpoint folder. Every manifest field loading reads
is type-checked first; a bad one raises :class:`CheckpointError` naming the field. :func:`latest_checkpoint` is
the one resolver: it returns exactly the checkpoint :func:`load_checkpoint` of the root loads, or raises its error.

Run config: ``save_checkpoint(..., config={"model": {...}, "seed": 0, "data": ..., "steps": ...})`` records the
run's settings; ``load_checkpoint(..., config=...)`` compares them field by field (dotted names such as
``model.heads``) and raises :class:`ConfigMismatch` naming every differing field, unless the change is deliberate
and listed in ``allow_changes=["steps"]``. The grid is not part of it: loading reshards.

Loading reads only the manifest and the files holding overlapping tiles (``torch.load(weights_only=True)``),
checks every file's size on every rank and the sha256 of every file it reads, and posts no collective before
one agreement all-reduce: a damaged or mismatched checkpoint raises :class:`CheckpointError` on every rank,
naming the file and the fix, and leaves the model, the optimizer and the files untouched.

Save-on-signal: :class:`SaveOnSignal` turns SIGTERM / SIGUSR1 (Slurm's ``--signal=USR1@120``) into a flag that
all ranks agree on at a step boundary, so the job saves and exits cleanly before its time limit.

    ckpt = CheckpointManager("ckpt", grid, keep=2, config={"model": asdict(cfg), "seed": seed, "steps": steps})
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

from .format import FORMAT, LATEST, MANIFEST, VERSION, CheckpointError, CheckpointWarning, LoadInfo
from .load import load_checkpoint
from .manager import CheckpointManager
from .runconfig import ConfigMismatch
from .save import save_checkpoint
from .signals import SaveOnSignal
from .store import latest_checkpoint, list_checkpoints, read_manifest, resolve_checkpoint, verify_checkpoint

__all__ = ["CheckpointError", "CheckpointWarning", "ConfigMismatch", "LoadInfo", "save_checkpoint", "load_checkpoint",
           "latest_checkpoint", "list_checkpoints", "read_manifest", "resolve_checkpoint", "verify_checkpoint",
           "CheckpointManager", "SaveOnSignal"]
