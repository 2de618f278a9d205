"""The memorization study's two halves: a loss that keeps a model from reproducing its training text verbatim
(:mod:`.goldfish`), and scores of how much of it a model does reproduce (:mod:`.scores`).

=================  ===================================================================================
:mod:`.goldfish`   :func:`~.goldfish.goldfish_mask` (hash or static), :func:`~.goldfish.step_mask` (a step's
                   mask and the global normaliser of its loss)
:mod:`.scores`     :func:`score_continuations`: exact match, token accuracy, ROUGE-L over token ids
=================  ===================================================================================
"""
from .scores import MemorizationScore, exact_match, lcs_length, rouge_l, score_continuations, token_accuracy

__all__ = ["MemorizationScore", "exact_match", "token_accuracy", "rouge_l", "lcs_length", "score_continuations"]
