"""Evaluation: perplexity and bits per byte on held-out text, and the trainer's periodic validation
(``perplexity``); zero-shot tasks (``zero_shot``); opening a checkpoint for inference (``inference``)."""

from .perplexity import EvalResult, evaluate_perplexity, token_byte_lengths

__all__ = ["EvalResult", "evaluate_perplexity", "token_byte_lengths"]
