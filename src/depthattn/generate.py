"""Generation on the KV cache: ``prefill``, ``decode_one_token``, sampling, ``generate`` / ``generate_stream``.

Legend: B batch, T prompt length, V vocab.

Left-padded batches work: the attention mask marks real tokens, RoPE positions count real tokens only, and the
cache remembers which slots are padding. ``naive_generate`` (no cache, a full forward per token) is the reference
twin the tests compare against.

Input values are checked once, here at the boundary (``check_forward_inputs`` on the prompt); the prefill and decode
steps then run without waiting for the device (shape checks only), and a stream without ``eos_token_id`` never
synchronises except to hand its tokens to the caller.

``compile=True`` runs the gpt-fast recipe (``CompiledDecoder``): the cache is switched to its static path (fixed
shapes, slot offsets on the device), ``decode_one_token`` is compiled once per (batch size, cache capacity) with
``torch.compile(fullgraph=True)`` (``mode="reduce-overhead"``, i.e. CUDA graphs, on CUDA; inductor's C++ wrapper
on CPU) and reused for every token, and the prefill is compiled separately with a dynamic prompt length. Eager
decode is its twin in the tests. ``stream_text`` / ``generate_text`` continue a text prompt with a ``tokenizers``
tokenizer (``generate`` and ``compare`` use them).
"""

from __future__ import annotations

import math
import warnings
from typing import Iterator

import torch
from torch import Tensor

from .accounting import check_fits, kv_cache_bytes
from .cache import KVCache
from .checks import check_forward_inputs, check_forward_shapes, check_text
from .model import DecoderLM


#: Temperatures below this are treated as 0 (greedy): dividing logits by them overflows float32.
MIN_TEMPERATURE = 1e-5


def sample(logits_BV: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
           generator: torch.Generator | None = None) -> Tensor:
    """Next tokens ``[B]`` (int64) from last-position logits ``[B, V]``.

    ``temperature`` below ``MIN_TEMPERATURE`` (e.g. 0) is greedy (argmax). ``top_k`` keeps exactly the k most likely
    tokens (ties broken by ``torch.topk``); ``top_p`` keeps the smallest set of most likely tokens whose probability
    reaches p (the most likely token is always kept). Raises ``ValueError`` for invalid options.
    """
    check_sampling(temperature, top_k, top_p)
    if temperature < MIN_TEMPERATURE:
        return logits_BV.argmax(-1)
    logits = logits_BV.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, logits.topk(top_k, dim=-1).indices, True)
        logits = logits.masked_fill(~keep, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs >= top_p  # keep tokens until the mass before them reaches top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise ``ValueError`` naming the option for a non-finite or negative temperature, top_k < 1, top_p ∉ (0, 1]."""
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature={temperature!r} must be a finite number >= 0")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k={top_k!r} must be an integer >= 1")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top_p={top_p!r} must be in (0, 1]")


def _last_logits(model: DecoderLM, input_ids_BT: Tensor, attention_mask_BT: Tensor | None,
                 cache: KVCache, advance_host: bool = True) -> Tensor:
    """Logits ``[B, V]`` of the last position only (the LM head runs on one position per row). ``advance_host``:
    see ``Backbone.forward``."""
    h = model.model(input_ids_BT, attention_mask_BT, None, cache, validate=False, advance_host=advance_host)
    return model.lm_head(h[:, -1])


@torch.inference_mode()
def prefill(model: DecoderLM, input_ids_BT: Tensor, attention_mask_BT: Tensor | None, cache: KVCache) -> Tensor:
    """Run the prompt through the model into ``cache``; return the last position's logits ``[B, V]``."""
    check_forward_shapes(model.config, input_ids_BT, attention_mask_BT, None, None, cache)
    return _last_logits(model, input_ids_BT, attention_mask_BT, cache)


@torch.inference_mode()
def decode_one_token(model: DecoderLM, token_B: Tensor, cache: KVCache) -> Tensor:
    """Append one token per row to ``cache``; return the next logits ``[B, V]``."""
    cache.check_room(1)
    return _last_logits(model, token_B[:, None], None, cache)


# ---------------------------------------------------------------------------------------------------- compiled
#: The ``torch.compile`` backend ``compile=True`` means.
DEFAULT_BACKEND = "inductor"

#: Inductor options of the compiled CPU decode step (``CompiledDecoder(cpp_wrapper=True)``): the C++ wrapper, and
#: concatenations (RoPE's halves, Depth-Attention's stacked candidate keys) computed inside their consumer's loop
#: instead of into a buffer of their own, which saves the wrapper an allocation and a view per input.
CPU_DECODE_OPTIONS = {"cpp_wrapper": True, "force_pointwise_cat": True}


class CompileUnavailable(RuntimeError):
    """``torch.compile``'s backend failed on this machine (e.g. no working C/C++ compiler for inductor on CPU)."""


class CompileLimitReached(RuntimeError):
    """A ``CompiledDecoder`` needed one more graph than dynamo allows for its prefill or decode-step function in this
    process (``torch._dynamo.config.recompile_limit`` per function, ``accumulated_recompile_limit`` in all): the
    decode step has one graph per model structure (method, config), batch size and cache capacity; the prefill one
    per model structure."""


def _backend_error(backend, e: Exception) -> CompileUnavailable:
    cause = getattr(e, "inner_exception", None) or e  # BackendCompilerFailed wraps the backend's own error
    lines = [line for line in str(cause).strip().splitlines() if line.strip()]
    name = backend if isinstance(backend, str) else getattr(backend, "__name__", type(backend).__name__)
    return CompileUnavailable(f"torch.compile (backend {name!r}) does not work here: "
                              f"{type(cause).__name__}: {lines[0] if lines else ''}")


def check_compile_works(device: torch.device | str, backend=None) -> None:
    """Compile and run a one-line function on ``device`` with ``backend`` (default ``DEFAULT_BACKEND``); raise
    ``CompileUnavailable`` (one line naming the cause) if it cannot, e.g. without a working C++ compiler for
    inductor on CPU."""
    backend = backend or DEFAULT_BACKEND
    try:
        torch.compile(lambda x: x * 2 + 1, fullgraph=True, backend=backend)(torch.ones(4, device=device))
    except torch._dynamo.exc.BackendCompilerFailed as e:
        raise _backend_error(backend, e) from None


# Two distinct functions (code objects), so that the decode graph (static shapes) and the prefill graph (dynamic
# prompt length) are cached separately by dynamo.
# Both leave ``cache.length`` to ``CompiledDecoder`` (``advance_host=False``).
def _static_decode(model: DecoderLM, token_B: Tensor, cache: KVCache) -> Tensor:
    return _last_logits(model, token_B[:, None], None, cache, advance_host=False)


def _static_prefill(model: DecoderLM, input_ids_BT: Tensor, attention_mask_BT: Tensor | None,
                    cache: KVCache) -> Tensor:
    return _last_logits(model, input_ids_BT, attention_mask_BT, cache, advance_host=False)


class CompiledDecoder:
    """Compiled ``prefill`` and ``decode_one_token`` on a cache's static path (gpt-fast style).

    The decode step is ``torch.compile(fullgraph=True, dynamic=False)``: one graph per (batch size, cache capacity,
    dtype, device) reused for every token, since the step reads only device state (``cache.slot``, ``key_mask``)
    and its shapes never change. The host half of the bookkeeping (capacity check, ``cache.length``) happens here,
    outside the graph. The prefill is compiled with ``dynamic=True`` (one graph for any prompt length). A static
    cache also works with the eager functions and ``DecoderLM.forward``.

    On CPU the decode step is compiled with ``CPU_DECODE_OPTIONS``: inductor's C++ wrapper, so the generated
    step's bookkeeping (buffer allocations, views, frees: several hundred for the ``small`` preset) runs as
    compiled C++ instead of Python, and concatenations computed in their consumers' loops, so there is less of
    it. At decode batch 1 that bookkeeping, not arithmetic, was the largest cost of the step, and Depth-Attention's
    mix adds about 10 such statements per mixing layer (docs/benchmarks.md). If the C++ wrapper fails to build
    (it compiles a Python extension, so it needs Python's headers) the step falls back to the Python wrapper
    with one warning.

    Args:
        backend: a ``torch.compile`` backend, by name or callable (default inductor; ``"eager"`` or
            ``"aot_eager"`` check capture only), or None to run the static path uncompiled (the twin that
            separates the static math from compilation).
        cpp_wrapper: inductor's C++ wrapper for the decode step on CPU; default (None) on with inductor. False
            keeps inductor's Python wrapper (the slower twin; easier to read with ``TORCH_LOGS=output_code``).
    Raises:
        ValueError: ``cpp_wrapper=True`` with a backend other than inductor.
        CompileUnavailable: on the first call, if the backend fails to compile (one line naming the cause).
        CompileLimitReached: when dynamo's recompile limit stops a new graph (one line naming the limits).
    """

    def __init__(self, backend=DEFAULT_BACKEND, cpp_wrapper: bool | None = None):
        if cpp_wrapper and backend != "inductor":
            raise ValueError(f"cpp_wrapper=True needs the inductor backend, got backend={backend!r}")
        self.backend = backend
        self.cpp_wrapper = backend == "inductor" if cpp_wrapper is None else cpp_wrapper
        self._decode = self._prefill = None

    def _compiled(self, fn, dynamic: bool, device: torch.device):
        if self.backend is None:
            return fn
        opts = {}
        if self.backend == "inductor" and device.type == "cuda" and not dynamic:
            opts["mode"] = "reduce-overhead"  # CUDA graphs for the launch-bound decode step
        elif self.cpp_wrapper and device.type == "cpu" and not dynamic:
            opts["options"] = dict(CPU_DECODE_OPTIONS)
        return torch.compile(fn, fullgraph=True, dynamic=dynamic, backend=self.backend, **opts)

    def _decode_step(self, model: DecoderLM, token_B: Tensor, cache: KVCache) -> Tensor:
        """The compiled step; the first call compiles it, falling back to the Python wrapper if the C++ one fails."""
        first = self._decode is None
        if first:
            self._decode = self._compiled(_static_decode, False, token_B.device)
        try:
            return self._run("decode step", self._decode, model, token_B, cache)
        except CompileUnavailable as e:
            if not (first and self.cpp_wrapper and token_B.device.type == "cpu"):
                raise
            warnings.warn(f"compiled decode: inductor's C++ wrapper failed ({e}); using its Python wrapper",
                          RuntimeWarning, stacklevel=3)
            self.cpp_wrapper = False
            self._decode = self._compiled(_static_decode, False, token_B.device)
            return self._run("decode step", self._decode, model, token_B, cache)

    def _run(self, phase: str, fn, *args):
        try:
            return fn(*args)
        except torch._dynamo.exc.BackendCompilerFailed as e:
            raise _backend_error(self.backend, e) from None
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            cfg = torch._dynamo.config
            remedy = ("reuse a batch size and cache capacity" if phase == "decode step" else
                      "compile fewer model structures in one process")
            raise CompileLimitReached(
                f"compiled {phase}: dynamo's recompile limit is reached (torch._dynamo.config.recompile_limit = "
                f"{cfg.recompile_limit} graphs per function, accumulated_recompile_limit = "
                f"{cfg.accumulated_recompile_limit}): this process compiled the {phase} for too many model "
                f"structures or shapes; raise the limit, or {remedy}") from None

    @staticmethod
    def _advance_host(cache: KVCache, T: int) -> None:
        """The host half of ``cache.advance``, which the static steps leave out (``advance_host=False``)."""
        cache.advance_host(T)

    @staticmethod
    def prepare(cache: KVCache) -> None:
        """Switch ``cache`` to its static path (and, on CUDA, give its tensors static addresses for CUDA graphs)."""
        cache.static = True
        if cache.k.device.type == "cuda":
            for t in (cache.k, cache.v, cache.key_mask, cache.slot, cache.layer_index):
                torch._dynamo.mark_static_address(t)

    @torch.inference_mode()
    def prefill(self, model: DecoderLM, input_ids_BT: Tensor, attention_mask_BT: Tensor | None,
                cache: KVCache) -> Tensor:
        """``prefill`` on the static path, compiled; logits ``[B, V]``."""
        check_forward_shapes(model.config, input_ids_BT, attention_mask_BT, None, None, cache)
        self.prepare(cache)
        if self._prefill is None:
            self._prefill = self._compiled(_static_prefill, True, input_ids_BT.device)
        logits = self._run("prefill", self._prefill, model, input_ids_BT, attention_mask_BT, cache)
        self._advance_host(cache, input_ids_BT.shape[1])
        return logits

    @torch.inference_mode()
    def decode_one_token(self, model: DecoderLM, token_B: Tensor, cache: KVCache) -> Tensor:
        """``decode_one_token`` on the static path, compiled once per shape; logits ``[B, V]``."""
        cache.check_room(1)
        self.prepare(cache)
        logits = self._decode_step(model, token_B, cache)
        self._advance_host(cache, 1)
        return logits.clone() if logits.device.type == "cuda" else logits  # CUDA graphs reuse the output buffer


def generate_stream(model: DecoderLM, input_ids: Tensor, max_new_tokens: int, temperature: float = 1.0,
                    top_k: int | None = None, top_p: float | None = None, eos_token_id: int | None = None,
                    seed: int | None = None, attention_mask: Tensor | None = None,
                    compile=False) -> Iterator[Tensor]:
    """Yield the next token of every row (``[B]`` int64) one step at a time, using the KV cache.

    Rows that produced ``eos_token_id`` keep yielding it; the stream ends when every row has, or after
    ``max_new_tokens`` steps. ``compile``: True (inductor) or a ``torch.compile`` backend (name or callable) runs the compiled
    ``CompiledDecoder`` (same tokens as eager under greedy decoding). Arguments are checked on the call, before the
    first token: ``ValueError`` for bad sampling options, an ``eos_token_id`` outside the vocabulary, ``input_ids``
    that are not ``[B, T]``, a prompt plus budget longer than ``max_position_embeddings``, and every value check of
    ``check_forward_inputs`` (ids outside the vocabulary, a mask that is not 0/1 or not ``[B, T]``).
    """
    check_sampling(temperature, top_k, top_p)
    V, max_pos = model.config.vocab_size, model.config.max_position_embeddings
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} must be an integer >= 0")
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        raise ValueError(f"input_ids must be a [B, T] tensor, got shape {tuple(getattr(input_ids, 'shape', ()))}")
    if eos_token_id is not None and not 0 <= eos_token_id < V:
        raise ValueError(f"eos_token_id={eos_token_id} is outside the vocabulary [0, {V})")
    if input_ids.shape[1] + max_new_tokens > max_pos:
        raise ValueError(f"prompt length {input_ids.shape[1]} + max_new_tokens {max_new_tokens} exceeds "
                         f"max_position_embeddings={max_pos}")
    if attention_mask is not None and tuple(getattr(attention_mask, "shape", ())) != tuple(input_ids.shape):
        raise ValueError(f"attention_mask shape {tuple(getattr(attention_mask, 'shape', ()))} must be the prompt's "
                         f"{tuple(input_ids.shape)}")
    check_forward_inputs(model.config, input_ids, attention_mask, None, None, None)  # the boundary: values once
    steps = CompiledDecoder(DEFAULT_BACKEND if compile is True else compile) if compile else None
    return _stream(model, input_ids, max_new_tokens, temperature, top_k, top_p, eos_token_id, seed, attention_mask,
                   steps)


def _stream(model, input_ids, max_new_tokens, temperature, top_k, top_p, eos_token_id, seed, attention_mask,
            steps: "CompiledDecoder | None"):
    if max_new_tokens == 0:
        return
    B, T = input_ids.shape
    generator = None
    if seed is not None:
        generator = torch.Generator(device=input_ids.device).manual_seed(seed)
    was_training = model.training
    model.eval()
    try:
        p = model.lm_head.weight
        check_fits(kv_cache_bytes(model.config, B, T + max_new_tokens, p.dtype),
                   f"the KV cache for {B} × {T + max_new_tokens} tokens over {model.config.num_virtual_layers} "
                   f"virtual layers", p.device, "lower max_new_tokens (--max-new-tokens), the prompt or the batch")
        cache = model.new_cache(B, T + max_new_tokens)
        run_prefill, run_decode = (prefill, decode_one_token) if steps is None else (steps.prefill,
                                                                                       steps.decode_one_token)
        logits = run_prefill(model, input_ids, attention_mask, cache)
        done = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
        for step in range(max_new_tokens):
            token = sample(logits, temperature, top_k, top_p, generator)
            if eos_token_id is not None:
                token = token.masked_fill(done, eos_token_id)
                done |= token == eos_token_id
            yield token
            if step + 1 == max_new_tokens or (eos_token_id is not None and bool(done.all())):
                return
            logits = run_decode(model, token, cache)
    finally:
        model.train(was_training)


def generate(model: DecoderLM, input_ids: Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, eos_token_id: int | None = None,
             seed: int | None = None, attention_mask: Tensor | None = None,
             compile=False) -> Tensor:
    """Prompt plus generated tokens, ``[B, T + n]`` int64 (n ≤ max_new_tokens; finished rows padded with EOS).
    Arguments and errors: ``generate_stream``."""
    new = list(generate_stream(model, input_ids, max_new_tokens, temperature, top_k, top_p, eos_token_id, seed,
                               attention_mask, compile))
    if not new:
        return input_ids
    return torch.cat([input_ids, torch.stack(new, dim=1)], dim=1)


@torch.inference_mode()
def naive_generate(model: DecoderLM, input_ids: Tensor, max_new_tokens: int,
                   attention_mask: Tensor | None = None) -> Tensor:
    """Greedy reference without a cache: one full forward over the whole sequence per new token."""
    check_forward_inputs(model.config, input_ids, attention_mask, None, None, None)
    ids = input_ids
    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
    for _ in range(max_new_tokens):
        token = model(ids, attention_mask=mask).logits[:, -1].argmax(-1)
        ids = torch.cat([ids, token[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(token[:, None], dtype=mask.dtype)], dim=1)
    return ids


# ---------------------------------------------------------------------------------------------------- text
def stream_text(model, tokenizer, prompt: str, *, max_new_tokens: int = 100, temperature: float = 0.8,
                top_k: int | None = 50, top_p: float | None = None, seed: int | None = 0,
                device: torch.device | str = "cpu", compile=False) -> Iterator[str]:
    """Yield decoded text pieces of the continuation of ``prompt`` (``generate_stream``, KV cache; ``compile`` as
    there), stopping at ``<|endoftext|>``. A piece is emitted once its bytes form complete UTF-8 characters.
    ``ValueError`` if ``prompt`` is not valid Unicode text (``checks.check_text``) or empty after tokenisation."""
    from .data import EOS_TOKEN

    check_text(prompt, "prompt")  # ValueError for a lone surrogate (bytes that were not UTF-8), not a TypeError
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    if not ids:
        raise ValueError("--prompt must not be empty")
    eos = tokenizer.token_to_id(EOS_TOKEN)
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    new: list[int] = []
    shown = ""
    for token in generate_stream(model, input_ids, max_new_tokens, temperature=temperature, top_k=top_k,
                                 top_p=top_p, eos_token_id=eos, seed=seed, compile=compile):
        t = int(token[0])
        if t == eos:
            break
        new.append(t)
        text = tokenizer.decode(new, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next byte-level token
            continue
        yield text[len(shown):]
        shown = text
    text = tokenizer.decode(new, skip_special_tokens=True)
    if len(text) > len(shown):
        yield text[len(shown):]


def generate_text(model, tokenizer, prompt: str, **kw) -> str:
    """The whole continuation of ``prompt`` as one string (``stream_text`` joined)."""
    return "".join(stream_text(model, tokenizer, prompt, **kw))
