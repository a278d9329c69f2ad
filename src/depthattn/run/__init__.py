"""The mechanism of a run on disk: what a checkpoint holds and how it is read back (``state``: the trainer state).

This package sits below ``depthattn.training`` and never imports it: the training loop decides when to save and what
a resume may change; the modules here only say what is written and read.
"""
