"""Evaluation: perplexity and bits per byte on held-out text (``perplexity``); zero-shot tasks (``zero_shot``)."""

from .perplexity import EvalResult, evaluate_perplexity, token_byte_lengths

__all__ = ["EvalResult", "evaluate_perplexity", "token_byte_lengths"]
