"""Evaluation of trained models: how much of its training text a model reproduces (:mod:`.memorization`)."""
from .memorization import MemorizationScore, exact_match, lcs_length, rouge_l, score_continuations, token_accuracy

__all__ = ["MemorizationScore", "exact_match", "token_accuracy", "rouge_l", "lcs_length", "score_continuations"]
