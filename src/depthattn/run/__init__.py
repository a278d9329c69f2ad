"""The mechanism of a run on disk: its folder (``folder``: ``RunFolder``), the folder's lock (``lock``), what a
checkpoint's trainer state holds (``state``) and which checkpoints pruning keeps (``retention``).

This package sits below ``depthattn.training`` and never imports it: the training loop decides when to save and what
a resume may change; the modules here only say what is written and read.
"""
