"""What the training drivers (experiments/train/: train_gpt, finetune, memorization) are built from, so that each
script holds only what is its own.

===================  =================================================================================
:mod:`.options`      the shared command-line options (:func:`add_step_arguments`, :func:`add_run_arguments`,
                     :func:`add_data_arguments`, :func:`parse_step_args`, :func:`check_run_arguments`,
                     :func:`check_step_arguments`, :func:`check_output_paths`, :func:`check_data_arguments`,
                     :func:`check_zero`, :func:`check_context_parallel`, :func:`check_expert_parallel`, :func:`data_settings`,
                     :func:`check_corpus_tokenizer`),
                     :func:`compute_dtype`
:mod:`.step`         :class:`StepSettings` and :func:`run_step`: one optimizer step on a global batch;
                     :func:`share_rows`: the rows of it a rank computes
:mod:`.checkpoints`  :class:`RunCheckpoints`: resume, save every K steps, at the end and on a stop signal
:mod:`.evaluate`     :func:`evaluate`: validation loss and perplexity on fixed batches (``--eval-interval``)
:mod:`.data`         :class:`RunData`: the run's batches (the ``--data-path`` corpus or the driver's own), when
                     to evaluate, the data position a checkpoint stores; ``--data synthetic|text``
                     (:func:`add_own_data_arguments`, :func:`check_own_data_arguments`, :func:`own_batches`)
===================  =================================================================================
"""
from .checkpoints import RunCheckpoints
from .data import RunData, add_own_data_arguments, check_own_data_arguments, own_batches
from .evaluate import evaluate
from .options import (add_context_parallel_argument, add_expert_parallel_argument, check_expert_parallel, add_data_arguments, add_run_arguments, add_step_arguments,
                      check_context_parallel, check_corpus_tokenizer,
                      check_data_arguments, check_output_paths, check_run_arguments, check_step_arguments,
                      check_zero, compute_dtype, data_settings, parse_step_args, run_outputs,
                      unrecorded_note)
from .step import StepSettings, check_batch_split, run_step, share_rows

__all__ = ["add_context_parallel_argument", "add_expert_parallel_argument", "check_expert_parallel", "check_context_parallel", "RunCheckpoints", "RunData", "add_own_data_arguments", "check_own_data_arguments", "own_batches", "evaluate", "add_data_arguments", "add_run_arguments", "add_step_arguments",
           "check_corpus_tokenizer", "check_data_arguments", "check_output_paths", "check_run_arguments",
           "check_step_arguments", "check_zero", "compute_dtype", "data_settings", "parse_step_args", "run_outputs",
           "unrecorded_note",
           "StepSettings", "check_batch_split", "run_step", "share_rows"]
