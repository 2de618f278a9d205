"""What the training drivers (experiments/train/: train_gpt, finetune, memorization) are built from, so that each
script holds only what is its own.

===================  =================================================================================
:mod:`.options`      the shared command-line options (:func:`add_step_arguments`, :func:`add_run_arguments`,
                     :func:`parse_step_args`, :func:`check_run_arguments`), :func:`compute_dtype`
:mod:`.step`         :class:`StepSettings` and :func:`run_step`: one optimizer step on a global batch
:mod:`.checkpoints`  :class:`RunCheckpoints`: resume, save every K steps, at the end and on a stop signal
:mod:`.evaluate`     :func:`heldout_loss`: the mean loss per kept target of held-out rows
===================  =================================================================================
"""
from .checkpoints import RunCheckpoints
from .evaluate import heldout_loss
from .options import add_run_arguments, add_step_arguments, check_run_arguments, compute_dtype, parse_step_args
from .step import StepSettings, check_batch_split, run_step

__all__ = ["RunCheckpoints", "add_run_arguments", "add_step_arguments", "check_run_arguments", "compute_dtype",
           "parse_step_args", "StepSettings", "check_batch_split", "heldout_loss", "run_step"]
