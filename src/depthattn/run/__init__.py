"""The mechanism of a run on disk, below ``depthattn.training`` (which never imports back: the training loop decides
when to save and what a resume may change; the modules here say what is written and how it is read).

``folder`` (``RunFolder``: the files of a run folder), ``lock`` (``RunLock``), ``state`` (``TrainerState``: what
``trainer_state.pt`` holds), ``checkpoints`` (writing a checkpoint, reading one back, pruning), ``dcp`` (an FSDP
run's sharded checkpoints), ``checkpointer`` (``Checkpointer``: the trainer's saves), ``retention`` (which
checkpoints pruning keeps), ``record`` (what ``run.json`` records of the machine; the upgrade of older records) and
``faults`` (the tests' fault-injection hooks). The names of every file are ``depthattn.layout``'s.
"""
