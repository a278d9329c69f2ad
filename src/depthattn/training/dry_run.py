"""``depthattn train --dry-run``: what a run will cost, from the model built on the meta device (nothing allocated).

Per GPU (``nproc`` data-parallel ranks; FSDP shards parameters, gradients and AdamW states over them, DDP and one
process keep them whole):

* parameters float32 (4 B each), gradients float32 (4 B), AdamW ``exp_avg`` + ``exp_avg_sq`` (8 B);
* FSDP's unsharded bf16 copies in flight: the root's (embedding, LM head: all-gathered through the step) and two
  blocks' (the current one and the prefetched next);
* activations of one micro-batch (``batch_size × seq_len`` tokens): the tensors autograd saves, counted on this
  implementation per token and block as ``6C + 4F + 6·H·D + 2·K·D + 2H`` elements (two RMSNorms, SwiGLU, q/k/v with
  their norms and RoPE, the attention output and its log-sum-exp; memory-efficient attention: no T×T scores)
  plus the method's own (``METHOD_ACTIVATIONS``), and ``V + 3.5C`` per token outside the blocks (embedding, final
  norm, float32 logits of the loss). With activation checkpointing a block keeps only its input (the method's
  in-flight state, ``accounting.inflight_bytes_per_token``) and one block's activations live during recompute.
  Elements are 4 B in float32, 2 B in bf16 (logits stay float32).

The counts were measured with ``torch.autograd.graph.saved_tensors_hooks`` on CPU float32
(tests/training/test_dry_run.py keeps the estimate within 30 % of a measured step at the ``small`` preset).

The plan is the config's on ``nproc`` ranks: with ``global_batch_tokens`` set, ``grad_accum`` follows for that world
size (``TrainConfig.for_world``), so the global batch and the budget are the ones the config was written for;
without it, ``grad_accum`` is per rank and the global batch scales with ``nproc`` (the report says so). The report
prints the ``torchrun`` commands that launch the plan (one node, and several nodes of ``gpus_per_node``), flags a
wall-time target that needs more than ``MAX_MFU`` of a GPU's peak as unreachable, and gives the throughput and wall
time expected at ``ASSUMED_MFU`` of each listed GPU's peak dense bf16 FLOP/s (``metrics.PEAK_BF16_FLOPS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..accounting import inflight_bytes_per_token, layer_params, num_flops
from ..config import ModelConfig
from .build import build_on_meta
from .config import TrainConfig
from .metrics import PEAK_BF16_FLOPS, train_flops_per_token

#: MFU above which a target is flagged unreachable (well-tuned dense LLM training reports 40-55 % on H100/A100).
MAX_MFU = 0.60
#: The MFU the expected throughput assumes.
ASSUMED_MFU = 0.40
#: The GPUs the report plans for (names in ``metrics.PEAK_BF16_FLOPS``).
PLAN_GPUS = ("H100", "A100", "B200")

#: A method's own saved activations per token and block, in multiples of ``hidden_size`` (measured as above).
#: The controls' fixed mixes are linear in the values and save nothing of their own (measured at ``small``: the
#: same bytes as ``none``); a method missing here is estimated at 1.0, and ``report`` says so.
METHOD_ACTIVATIONS: dict[str, float] = {"none": 0.0, "depth_attention": 1.1, "denseformer": 1.0, "attnres": 2.0,
                                        "mhc": 34.0, "value_residual": 0.0, "depth_attention_uniform": 0.0}


@dataclass
class DryRun:
    """The numbers ``--dry-run`` prints (bytes per GPU, FLOPs per trained token, tokens/s needed)."""

    params: int
    train_flops_per_token: float
    forward_flops_per_token: float
    nproc: int
    sharded: bool
    param_bytes: float
    grad_bytes: float
    optimizer_bytes: float
    gather_bytes: float
    activation_bytes: float
    activation_bytes_checkpointed: float
    tokens_per_step: int
    total_tokens: int
    activation_checkpointing: bool
    grad_accum: int = 1
    batch_size: int = 1
    seq_len: int = 1
    global_batch_set: bool = False  # TrainConfig.global_batch_tokens fixed the batch (grad_accum derived)

    @property
    def total_bytes(self) -> float:
        """Per-GPU total with the run's activation-checkpointing setting."""
        act = self.activation_bytes_checkpointed if self.activation_checkpointing else self.activation_bytes
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.gather_bytes + act

    def tokens_per_s_for(self, hours: float) -> float:
        """Training tokens per second (all GPUs) to finish the budget in ``hours``."""
        return self.total_tokens / (hours * 3600.0)


def block_activation_elements(cfg: ModelConfig) -> float:
    """Saved elements per token of one block (module docstring)."""
    C, F, H, K, D = (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                     cfg.head_dim)
    return 6 * C + 4 * F + 6 * H * D + 2 * K * D + 2 * H + METHOD_ACTIVATIONS.get(cfg.cross_layer, 1.0) * C


def activation_bytes(cfg: ModelConfig, tokens: int, itemsize: int, checkpointed: bool) -> float:
    """Saved activations of one micro-batch of ``tokens`` tokens (module docstring)."""
    L = cfg.num_virtual_layers
    outside = cfg.vocab_size * 4 + 3.5 * cfg.hidden_size * itemsize
    block = block_activation_elements(cfg) * itemsize
    if checkpointed:
        inflight = inflight_bytes_per_token(cfg) / 2 * itemsize  # accounting counts bf16 bytes
        return tokens * (L * inflight + block + outside)
    return tokens * (L * block + outside)


def dry_run(model_cfg: ModelConfig, train_cfg: TrainConfig, nproc: int = 1) -> DryRun:
    """Build ``model_cfg`` on the meta device and estimate one GPU's share of a run on ``nproc`` ranks.

    Raises ``ValueError`` for ``nproc < 1``, a ``global_batch_tokens`` that ``nproc`` ranks cannot split
    (``TrainConfig.for_world``) or a budget shorter than one step."""
    if nproc < 1:
        raise ValueError(f"--nproc {nproc} must be >= 1")
    fixed = train_cfg.global_batch_tokens is not None
    train_cfg = train_cfg.for_world(nproc)
    params = build_on_meta(model_cfg).num_params()
    sharded = train_cfg.data_parallel == "fsdp"
    share = nproc if sharded else 1
    bf16 = train_cfg.precision == "bfloat16" or (train_cfg.precision == "auto" and train_cfg.device != "cpu")
    itemsize = 2 if bf16 else 4
    gather = 0.0
    if sharded:
        root = model_cfg.vocab_size * model_cfg.hidden_size * (1 if model_cfg.tie_word_embeddings else 2)
        gather = (root + 2 * layer_params(model_cfg)) * itemsize
    tokens = train_cfg.batch_size * train_cfg.seq_len
    per_step = train_cfg.batch_size * train_cfg.grad_accum * train_cfg.seq_len * nproc
    total = train_cfg.tokens if train_cfg.steps is None and train_cfg.tokens else (train_cfg.steps or 0) * per_step
    return DryRun(params=params, train_flops_per_token=train_flops_per_token(model_cfg, train_cfg.seq_len),
                  forward_flops_per_token=num_flops(model_cfg, train_cfg.seq_len).total, nproc=nproc,
                  sharded=sharded, param_bytes=4 * params / share, grad_bytes=4 * params / share,
                  optimizer_bytes=8 * params / share, gather_bytes=gather,
                  activation_bytes=activation_bytes(model_cfg, tokens, itemsize, False),
                  activation_bytes_checkpointed=activation_bytes(model_cfg, tokens, itemsize, True),
                  tokens_per_step=per_step, total_tokens=total,
                  activation_checkpointing=train_cfg.activation_checkpointing, grad_accum=train_cfg.grad_accum,
                  batch_size=train_cfg.batch_size, seq_len=train_cfg.seq_len, global_batch_set=fixed)


def launch_commands(nproc: int, gpus_per_node: int, train_args: list[str], run_id: str = "RUN") -> list[str]:
    """The ``torchrun`` command lines of a plan on ``nproc`` ranks: one node (when ``nproc <= gpus_per_node``), and
    ``nproc / gpus_per_node`` nodes with a c10d rendezvous (when ``nproc`` is a multiple of ``gpus_per_node``
    above it; otherwise one line saying why there is none). ``train_args``: the ``train`` options (already
    quoted)."""
    tail = " ".join(["-m depthattn.cli train", *train_args])
    out = []
    if nproc <= gpus_per_node:
        out.append(f"torchrun --standalone --nproc_per_node={nproc} {tail}")
    if nproc > gpus_per_node and nproc % gpus_per_node == 0:
        out.append(f"torchrun --nnodes={nproc // gpus_per_node} --nproc_per_node={gpus_per_node} "
                   f"--rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:29500 --rdzv_id={run_id} {tail}")
    if not out:
        out.append(f"(none: {nproc} ranks do not fill whole nodes of {gpus_per_node} GPUs; set --gpus-per-node)")
    return out


def expected_throughput(d: DryRun, peak: float, mfu: float = ASSUMED_MFU) -> float:
    """Training tokens/s over all ``d.nproc`` GPUs at ``mfu`` of a per-GPU ``peak`` FLOP/s."""
    return mfu * peak / d.train_flops_per_token * d.nproc


def plan_lines(d: DryRun, hours: float) -> list[str]:
    """The batch, MFU-needed (unreachable above ``MAX_MFU``) and expected-throughput lines of the report."""
    peaks = dict(PEAK_BF16_FLOPS)
    need = d.tokens_per_s_for(hours)
    per_gpu_flops = need / d.nproc * d.train_flops_per_token
    batch = (f"global batch {d.tokens_per_step:,d} tokens per step = batch_size {d.batch_size} x grad_accum "
             f"{d.grad_accum} x seq_len {d.seq_len} x {d.nproc} rank(s)")
    batch += (" (grad_accum from global_batch_tokens)" if d.global_batch_set else
              "; grad_accum is per rank, so the global batch and a steps budget scale with --nproc (set "
              "global_batch_tokens to keep them)")
    mfus = [(name, per_gpu_flops / peaks[name]) for name in PLAN_GPUS]
    lines = [batch,
             f"to finish in {hours:g} h: {need:,.0f} tokens/s in all, {need / d.nproc:,.0f} per GPU "
             f"({per_gpu_flops / 1e12:.1f} TFLOP/s per GPU; MFU "
             + ", ".join(f"{100 * m:.0f}% on {name}" for name, m in mfus) + ")"]
    over = [name for name, m in mfus if m > MAX_MFU]
    if over:
        lines.append(f"  unreachable on {', '.join(over)}: above {100 * MAX_MFU:.0f}% MFU; raise --target-hours or "
                     f"--nproc")
    lines.append(f"expected at {100 * ASSUMED_MFU:.0f}% MFU: " + "; ".join(
        f"{name} {expected_throughput(d, peaks[name]):,.0f} tokens/s, "
        f"{d.total_tokens / expected_throughput(d, peaks[name]) / 3600:,.1f} h" for name in PLAN_GPUS))
    return lines


def report(d: DryRun, model_cfg: ModelConfig, hours: float, launch: list[str] | None = None,
           vocab_source: str | None = None) -> str:
    """The text ``--dry-run`` prints (``launch``: the ``launch_commands`` lines, printed last). Its second line
    names what the numbers assume: the vocabulary size (``vocab_source``: where it came from) and the sequence
    length."""
    gib = 2 ** 30
    mode = f"FSDP over {d.nproc} ranks" if d.sharded else (f"DDP on {d.nproc} ranks" if d.nproc > 1 else "1 process")
    lines = [f"dry run: {model_cfg.cross_layer}, {d.params:,d} parameters ({mode}); nothing allocated",
             f"assuming vocab_size {model_cfg.vocab_size:,d}"
             + (f" ({vocab_source})" if vocab_source else "")
             + f", seq_len {d.seq_len:,d} tokens, batch_size {d.batch_size} sequences per rank and micro-batch",
             f"FLOPs per token: forward {d.forward_flops_per_token:.4g}, training (3x) {d.train_flops_per_token:.4g}",
             "per-GPU memory (GiB):",
             f"  parameters (fp32)      {d.param_bytes / gib:9.2f}",
             f"  gradients (fp32)       {d.grad_bytes / gib:9.2f}",
             f"  AdamW states (fp32)    {d.optimizer_bytes / gib:9.2f}",
             *([f"  FSDP gathered (bf16)   {d.gather_bytes / gib:9.2f}"] if d.sharded else []),
             f"  activations            {d.activation_bytes / gib:9.2f}  (with activation checkpointing "
             f"{d.activation_bytes_checkpointed / gib:.2f})"
             + ("" if model_cfg.cross_layer in METHOD_ACTIVATIONS else
                f"; {model_cfg.cross_layer}'s own activations not measured, estimated at 1 x hidden_size per block"),
             f"  total                  {d.total_bytes / gib:9.2f}  (activation checkpointing "
             f"{'on' if d.activation_checkpointing else 'off'})",
             f"budget: {d.total_tokens:,d} tokens, {d.tokens_per_step:,d} per step",
             *plan_lines(d, hours)]
    if launch:
        lines += ["launch:", *(f"  {c}" for c in launch)]
    return "\n".join(lines)


def summary_dict(d: DryRun) -> dict[str, Any]:
    return {k: getattr(d, k) for k in d.__dataclass_fields__} | {"total_bytes": d.total_bytes}
