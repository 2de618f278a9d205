"""A driver's batches: the preprocessed corpus of ``--data-path`` (train split, validation every
``--eval-interval`` steps, the position saved with each checkpoint), or the driver's own in-memory batches.

    data = RunData.open(args, grid, settings, seq=S, seed=args.seed, vocab=V, start=start, resumed=ckpt.extra,
                        fallback=lambda: TextBatches(...))        # collective when --data-path is given
    for step in range(start, settings.steps):
        inputs, targets, mask = data.batch(step)                 # [B, S]: the rows this rank computes are read
        run_step(model, opt, grid, settings, step, inputs, targets, metrics, loss_mask=mask)
        data.after_step(step + 1, model, grid, metrics)          # an "eval" row when due
        ckpt.step_done(step + 1, model, opt, last=..., extra=data.extra(step + 1))
    data.evaluate(steps, model, grid, metrics)                   # an "eval" row now (has_validation)

The in-memory batches may carry a loss mask (``batch(step, size)`` returning ``(inputs, targets, mask)``, as
:class:`axgrid.data.sources.ChatSource` does: the assistant tokens) and held-out rows (``valid_iters(size)`` and
``valid_batch(i, size)``, as :mod:`axgrid.data.sources` has them), which :meth:`RunData.evaluate` scores.

The position is the number of train samples consumed (``{"data": {"consumed_samples": n}}`` in the checkpoint's
extra), so a run resumed on another grid, or with another ``--batch``, continues with the next sample of the same
global order. A checkpoint without it (saved by an older run) resumes at ``start · batch``.
"""
from __future__ import annotations

import argparse
from typing import Any, Callable, Mapping, Optional, Protocol

import torch

from ..core.grid import Grid
from ..metrics import Metrics
from .evaluate import evaluate
from .options import data_settings
from .step import StepSettings, share_rows


class Batches(Protocol):
    def batch(self, step: int, size: int) -> tuple[torch.Tensor, ...]: ...


class RunData:
    """See the module docstring. ``corpus`` is an :class:`axgrid.data.Corpus` or None (``batches`` then)."""

    def __init__(self, settings: StepSettings, grid: Grid, batches: Optional[Batches] = None, corpus: Any = None,
                 eval_interval: int = 0, eval_iters: int = 0) -> None:
        self.settings, self.grid, self.batches, self.corpus = settings, grid, batches, corpus
        self.eval_interval, self.eval_iters = eval_interval, eval_iters
        self.rows = settings.rows_read(grid)
        self.eval_rows = share_rows(settings.batch, settings.microbatches, grid)

    @classmethod
    def open(cls, args: argparse.Namespace, grid: Grid, settings: StepSettings, *, seq: int, seed: int, vocab: int,
             start: int, resumed: Mapping[str, Any], fallback: Callable[[], Batches]) -> "RunData":
        """The run's data: a Corpus when ``--data-path`` is given (collective; SystemExit with one line on every
        rank for bad data), else ``fallback()``."""
        ds = data_settings(args)
        interval = getattr(args, "eval_interval", 0)
        if ds is None:
            return cls(settings, grid, batches=fallback())
        from ..data.corpus import Corpus
        consumed = int((resumed.get("data") or {}).get("consumed_samples", start * settings.batch))
        train = consumed + max(settings.steps - start, 0) * settings.batch
        valid = args.eval_iters * settings.batch if interval else 0
        corpus = Corpus(ds, grid, seq=seq, seed=seed, vocab=vocab, train_samples=train, valid_samples=valid)
        corpus.seek(start, consumed, settings.batch)
        return cls(settings, grid, corpus=corpus, eval_interval=interval, eval_iters=args.eval_iters)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """The global batch of ``step``: ``(inputs, targets, loss mask or None)``, each ``[B, S]``."""
        if self.corpus is None:
            inputs, targets, *mask = self.batches.batch(step, self.settings.batch)
            return inputs, targets, (mask[0] if mask else None)
        return (*self.corpus.batch(step, self.settings.batch, self.rows, self.spans()), None)

    def spans(self) -> Optional[list[tuple[int, int]]]:
        """Under context parallelism the token positions of a sample this rank reads (its two chunks and their
        targets, :func:`axgrid.context_parallel.sample_spans`); None (whole rows) otherwise, and under Goldfish,
        whose mask hashes the tokens before each target and whose normaliser counts the whole batch."""
        cp = self.grid.size("c")
        if cp == 1 or self.rows is None or self.corpus is None:
            return None
        from ..context_parallel import sample_spans
        return sample_spans(self.corpus.seq, cp, self.grid.index("c"))

    @property
    def has_validation(self) -> bool:
        """Whether :meth:`evaluate` has rows to score: the corpus's validation split (``--eval-interval``), or the
        in-memory batches' held-out rows."""
        if self.corpus is not None:
            return bool(self.eval_interval)
        return bool(getattr(self.batches, "valid_iters", lambda size: 0)(self.settings.batch))

    def evaluate(self, steps_done: int, model: torch.nn.Module, grid: Grid, metrics: Metrics) -> dict[str, Any]:
        """Score the validation rows now (:func:`~axgrid.driver.evaluate.evaluate`); the ``eval`` row."""
        size = self.settings.batch
        if self.corpus is not None:
            result = evaluate(model, grid, self.settings,
                              lambda i: self.corpus.valid_batch(i, size, self.eval_rows, self.spans()),
                              self.eval_iters)
        else:
            result = evaluate(model, grid, self.settings, lambda i: self.batches.valid_batch(i, size),
                              self.batches.valid_iters(size))
        return metrics.evaluation(steps_done, **result)

    def eval_due(self, steps_done: int) -> bool:
        return bool(self.eval_interval) and (steps_done % self.eval_interval == 0 or
                                             steps_done == self.settings.steps)

    def after_step(self, steps_done: int, model: torch.nn.Module, grid: Grid, metrics: Metrics
                   ) -> Optional[dict[str, Any]]:
        """Evaluate when due (every ``--eval-interval`` steps and after the last); the ``eval`` row, or None."""
        if not self.eval_due(steps_done):
            return None
        return self.evaluate(steps_done, model, grid, metrics)

    def extra(self, steps_done: int) -> dict[str, Any]:
        """The checkpoint's ``extra`` after ``steps_done`` steps: the data position."""
        if self.corpus is None:
            return {}
        return {"data": self.corpus.position(steps_done, self.settings.batch)}

    def describe(self) -> str:
        return self.corpus.describe() if self.corpus is not None else ""


def add_own_data_arguments(p: argparse.ArgumentParser) -> None:
    """The pre-training drivers' data without a corpus: ``--data synthetic|text`` and ``--text-file`` (train_gpt,
    pretrain)."""
    from ..data import DEFAULT_TEXT
    p.add_argument("--data", choices=("synthetic", "text"), default=None,
                   help="without --data-path: uniform random ids (default) or --text-file as bytes")
    p.add_argument("--text-file", default=str(DEFAULT_TEXT))


def check_own_data_arguments(args: argparse.Namespace, vocab: int, model: str) -> None:
    """Set ``args.data`` (``corpus`` with ``--data-path``, else ``--data``, default ``synthetic``) and raise
    SystemExit with one line, identically on every rank before any collective, for data the model (``vocab`` ids,
    named ``model``) cannot take."""
    from ..data import ByteTokenizer
    import os
    if args.data_path and args.data not in (None, "corpus"):        # "corpus": set by an earlier call
        raise SystemExit(f"--data {args.data} and --data-path both name the data: leave --data out to train on the "
                         f"corpus")
    if args.data is None:
        args.data = "corpus" if args.data_path else "synthetic"
    if args.data == "text" and vocab < ByteTokenizer.vocab_size:
        raise SystemExit(f"--data text is byte-level (256 ids) but {model} has vocab {vocab}")
    if args.data == "text" and not os.path.isfile(args.text_file):
        raise SystemExit(f"--text-file {args.text_file} does not exist or is not a file: pass an existing UTF-8 text "
                         f"file, or use --data synthetic")


def own_batches(args: argparse.Namespace, seq: int, vocab: int) -> Batches:
    """The batches of ``--data text`` or ``synthetic`` (of ``--seed``): :class:`RunData.open`'s fallback."""
    from ..data import SyntheticBatches, TextBatches
    try:
        return (TextBatches(args.text_file, seq, args.seed) if args.data == "text"
                else SyntheticBatches(vocab, seq, args.seed))
    except (OSError, ValueError) as e:    # the same on every rank, before any collective
        raise SystemExit(f"--text-file {args.text_file}: {e}") from None
