"""Measure how fast a full training checkpoint is written: the save a preemption must fit into its grace period.

Builds a preset's model (float32), gives every parameter AdamW moments (one optimizer step on zero gradients), then
writes the checkpoint exactly as the trainer does (``checkpoints.save_checkpoint``: ``model.safetensors``, the configs,
``trainer_state.pt`` with the optimizer, every file fsync'd, the folder renamed into place) ``--repeats`` times into
``--out`` and prints the bytes, the seconds and MB/s of each write (1 MB = 10^6 bytes). The page cache is not
dropped: a write returns once fsync has put the bytes on the device, which is what a save waits for.

    python scripts/bench_save.py --preset 360m --out /tmp/save_bench --repeats 3

An FSDP run writes the same bytes as DCP shards, split over its ranks (each rank writes its share in parallel);
``docs/training-at-scale.md`` ("Grace period") turns the rate into the grace period a run needs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

from depthattn import DecoderLM, ModelConfig
from depthattn.data.tokenizer import tokenizer_bytes, train_bpe
from depthattn.run.state import TrainerState
from depthattn.training import TrainConfig
from depthattn.training.optim import build_optimizer, build_scheduler
from depthattn.run.checkpoints import save_checkpoint


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="360m")
    ap.add_argument("--out", required=True, help="a folder on the disk to measure (created; its run/ is replaced)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    torch.manual_seed(0)
    model = DecoderLM(ModelConfig.from_preset(args.preset))
    optimizer, _ = build_optimizer(model, 1e-4, 0.1, (0.9, 0.95), 1e-8)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # AdamW allocates exp_avg and exp_avg_sq (fp32): what a real checkpoint holds
    optimizer.zero_grad(set_to_none=True)
    scheduler = build_scheduler(optimizer, 1, 10, 0.1)
    params = sum(p.numel() for p in model.parameters())
    cfg = TrainConfig(steps=10, keep_last=1)
    run = Path(args.out) / "run"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        # the trainer copies the data's tokenizer into each checkpoint: a small real one (its size is nothing here)
        (data / "tokenizer.json").write_bytes(tokenizer_bytes(train_bpe(["a small text to train a tokenizer on"] * 50,
                                                                         vocab_size=300)))
        rows = []
        for i in range(args.repeats):
            state = TrainerState.capture(i + 1, 0, scheduler, optimizer).to_dict()
            t0 = time.perf_counter()
            target = save_checkpoint(run, model, cfg, data, state)
            dt = time.perf_counter() - t0
            size = folder_bytes(target)
            rows.append({"preset": args.preset, "parameters": params, "bytes": size, "seconds": round(dt, 2),
                         "MB_per_s": round(size / dt / 1e6, 1)})
            print(json.dumps(rows[-1]), flush=True)
    shutil.rmtree(run, ignore_errors=True)


if __name__ == "__main__":
    main()
