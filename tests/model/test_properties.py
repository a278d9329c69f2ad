"""Property-based tests (hypothesis) of the input boundaries: configs from arbitrary dicts and TOML bytes, token ids
of every integer dtype and shape, attention masks, and prompts of arbitrary Unicode. Each property is "valid and
usable, or one ``ValueError``": never another exception type, never a silent wrap. Models are tiny and built once
per module; examples are capped so that the module stays within a few seconds."""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from depthattn.checks import check_forward_inputs, check_text
from depthattn.config import ModelConfig
from depthattn.training.config import TrainConfig, load_toml, parse_value

from conftest import make_model

#: 60 examples per property in the suite, the same ones on every run (derandomised, no example database written);
#: DEPTHATTN_HYPOTHESIS_EXAMPLES=400 searches longer with fresh random examples (by hand, not in CI).
_SEARCH = os.environ.get("DEPTHATTN_HYPOTHESIS_EXAMPLES")
FAST = settings(max_examples=int(_SEARCH or 60), deadline=None, derandomize=not _SEARCH, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

#: Every integer dtype torch has, with its value range (the boundary check must compare without wrapping).
INT_DTYPES = {torch.int8: (-(1 << 7), (1 << 7) - 1), torch.uint8: (0, 255), torch.int16: (-(1 << 15), (1 << 15) - 1),
              torch.uint16: (0, (1 << 16) - 1), torch.int32: (-(1 << 31), (1 << 31) - 1),
              torch.uint32: (0, (1 << 32) - 1), torch.int64: (-(1 << 63), (1 << 63) - 1),
              torch.uint64: (0, (1 << 64) - 1)}
OTHER_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool, torch.complex64]
VOCAB = 300


@pytest.fixture(scope="module")
def model():
    return make_model(num_hidden_layers=2, vocab_size=VOCAB, depth_attention_stride=1)


# ---------------------------------------------------------------------------------------------------- configs
#: Values a TOML file, a JSON file or ``--set`` can hold (and some a Python caller can pass).
ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(1 << 70), max_value=1 << 70).map(lambda v: v ** 6),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["none", "depth_attention", "auto", "cpu", "fsdp", "ddp", "bfloat16", "float32"]),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


#: Values at the edges of what validation must classify: huge integers (beyond float), non-finite floats, bools where
#: numbers go, numbers as strings, containers, integers at int64's edge.
NASTY = [10 ** 400, -(10 ** 400), 1 << 63, -(1 << 63), float("nan"), float("inf"), -float("inf"), True, False, 0, -1,
         0.5, 1e308, "1", "", None, [], {}, [1], {"a": 1}]


def config_dicts(cls) -> st.SearchStrategy[dict]:
    """Dicts over ``cls``'s field names (sometimes one unknown key), each value either a plausible one of the field's
    own default type, or anything."""
    fields = [f.name for f in dataclasses.fields(cls)]
    plausible = st.one_of(st.integers(min_value=-2, max_value=64), st.floats(min_value=-1, max_value=2),
                          st.booleans(), st.none())
    keys = st.one_of(st.sampled_from(fields), st.text(min_size=1, max_size=8))
    return st.dictionaries(keys, st.one_of(plausible, ANY_VALUE, st.sampled_from(NASTY)), max_size=6)


def _valid_or_value_error(cls, values: dict) -> None:
    try:
        cfg = cls.from_dict(values)
    except ValueError as e:
        msg = str(e)
        assert msg and "\n" not in msg
        assert cls.__name__ in msg or "unknown" in msg, msg  # names the class's field, or the unknown key
        return
    assert cls.from_dict(cfg.to_dict()) == cfg  # a constructed config round-trips through its dict


@pytest.mark.parametrize("cls", [ModelConfig, TrainConfig])
def test_every_field_with_every_edge_value_is_valid_or_one_value_error(cls):
    """Exhaustive over (field, NASTY value) pairs: a search would rarely hit ``rope_theta = 10**400``."""
    for field in dataclasses.fields(cls):
        for value in NASTY:
            try:
                _valid_or_value_error(cls, {field.name: value})
            except (AssertionError, ValueError):
                raise
            except Exception as e:  # noqa: BLE001 -- the point of the test
                raise AssertionError(f"{cls.__name__}.{field.name}={value!r} raised {type(e).__name__}: {e}") from e


@pytest.mark.parametrize("cls", [ModelConfig, TrainConfig])
@FAST
@given(data=st.data())
def test_configs_from_random_dicts_are_valid_or_one_value_error(cls, data):
    _valid_or_value_error(cls, data.draw(config_dicts(cls)))


@FAST
@given(raw=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
                     st.builds(lambda k, v: f"{k} = {v}\n".encode(), st.sampled_from(["data", "preset", "model",
                                                                                      "train", "x"]),
                               st.sampled_from(["5", "true", '"tiny"', "[1, 2]", "{a = 1}", "1e999", '""']))))
def test_load_toml_of_any_bytes_is_a_config_or_one_value_error(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("toml") / "c.toml"
    path.write_bytes(raw)
    try:
        doc = load_toml(path)
    except ValueError as e:
        assert str(path) in str(e)  # the file is named
        return
    assert set(doc) == {"preset", "data", "model", "train"}
    assert all(doc[k] is None or (isinstance(doc[k], str) and doc[k]) for k in ("preset", "data"))


@FAST
@given(text=st.text(max_size=30))
def test_parse_value_never_raises(text):
    parse_value(text)


# ---------------------------------------------------------------------------------------------------- token ids
@st.composite
def id_tensors(draw):
    dtype = draw(st.sampled_from(list(INT_DTYPES)))
    lo, hi = INT_DTYPES[dtype]
    B, T = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    near = st.integers(max(lo, -2), min(hi, VOCAB + 2))  # around the bounds, where a wrap would show
    values = draw(st.lists(st.one_of(near, st.integers(lo, hi), st.sampled_from([lo, hi])),
                           min_size=B * T, max_size=B * T))
    return torch.tensor(values, dtype=dtype).view(B, T), values


@FAST
@given(case=id_tensors())
def test_boundary_accepts_exactly_the_ids_in_the_vocabulary(model, case):
    ids, values = case
    in_range = all(0 <= v < VOCAB for v in values)
    try:
        check_forward_inputs(model.config, ids, None, None, None, None)
    except ValueError as e:
        assert not in_range, f"{ids.dtype} ids {values} refused: {e}"
        bad = next(v for v in values if not 0 <= v < VOCAB)
        assert str(e) == f"input_ids contains token id {bad} outside the vocabulary [0, {VOCAB})"
        return
    assert in_range, f"{ids.dtype} ids {values} accepted"
    ref = model(torch.tensor(values, dtype=torch.int64).view(ids.shape)).logits
    assert torch.equal(model(ids).logits, ref)  # a narrow dtype gives the same logits as int64


@pytest.mark.parametrize("dtype", list(INT_DTYPES))
def test_uint8_style_small_ids_are_valid_in_every_integer_dtype(model, dtype):
    ids = torch.tensor([[1, 2]], dtype=dtype)
    check_forward_inputs(model.config, ids, None, None, ids, None)  # [[1, 2]] is in the vocabulary
    out = model(ids, labels=ids)
    ref = model(torch.tensor([[1, 2]]), labels=torch.tensor([[1, 2]]))
    assert torch.equal(out.logits, ref.logits) and torch.equal(out.loss, ref.loss)
    hi = INT_DTYPES[dtype][1]
    if hi >= VOCAB:
        with pytest.raises(ValueError, match=f"token id {VOCAB} outside"):
            check_forward_inputs(model.config, torch.tensor([[1, VOCAB]], dtype=dtype), None, None, None, None)
    if dtype.is_signed:
        with pytest.raises(ValueError, match="token id -1 outside"):
            check_forward_inputs(model.config, torch.tensor([[-1, 2]], dtype=dtype), None, None, None, None)


@pytest.mark.parametrize("dtype", OTHER_DTYPES)
def test_non_integer_ids_are_refused_in_one_line(model, dtype):
    with pytest.raises(ValueError, match=f"input_ids must be an integer tensor \\[B, T\\], got {dtype}") as e:
        check_forward_inputs(model.config, torch.ones(1, 2, dtype=dtype), None, None, None, None)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------------- masks
@st.composite
def masks(draw):
    B, T = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    shape = draw(st.sampled_from([(B, T), (B, T), (B, T), (B, T + 1), (B + 1, T), (T,)]))
    dtype = draw(st.sampled_from([torch.bool, torch.int64, torch.uint8, torch.int8, torch.float32]))
    cells = math.prod(shape)
    alphabet = [0, 1] if dtype == torch.bool else draw(st.sampled_from([[0, 1], [0, 1, 2], [-1, 0, 1]]))
    values = draw(st.lists(st.sampled_from(alphabet), min_size=cells, max_size=cells))
    return (B, T), torch.tensor(values, dtype=dtype).view(shape)


@FAST
@given(case=masks())
def test_masks_are_valid_or_one_value_error(model, case):
    (B, T), mask = case
    ids = torch.ones(B, T, dtype=torch.long)
    valid = (mask.dtype != torch.float32 and tuple(mask.shape) == (B, T)
             and bool(((mask == 0) | (mask == 1)).all()) and bool(mask.bool().any(dim=1).all()))
    try:
        check_forward_inputs(model.config, ids, mask, None, None, None)
    except ValueError as e:
        assert not valid and "attention_mask" in str(e) and "\n" not in str(e)
        if tuple(mask.shape) == (B, T) and mask.dtype != torch.float32 and bool(((mask == 0) | (mask == 1)).all()):
            row = int((~mask.bool().any(dim=1)).nonzero()[0, 0])
            assert f"attention_mask row {row} is all zeros" in str(e)
        return
    assert valid
    assert torch.isfinite(model(ids, attention_mask=mask).logits).all()


def test_an_all_zero_mask_row_is_refused_at_generate_and_the_hf_forward(model):
    from depthattn.generate import generate
    from depthattn.hf.modeling import DepthAttnForCausalLM

    ids, mask = torch.ones(2, 3, dtype=torch.long), torch.tensor([[0, 1, 1], [0, 0, 0]])
    with pytest.raises(ValueError, match="attention_mask row 1 is all zeros: that sequence has no real token"):
        generate(model, ids, 2, attention_mask=mask)
    hf = DepthAttnForCausalLM.from_core(model).eval()
    with pytest.raises(ValueError, match="attention_mask row 1 is all zeros"):
        hf(input_ids=ids, attention_mask=mask)
    hf(input_ids=ids, attention_mask=torch.tensor([[0, 1, 1], [0, 0, 1]]))  # one real token is enough


# ---------------------------------------------------------------------------------------------------- prompts
@pytest.fixture(scope="module")
def tokenizer():
    from depthattn.data.corpus import embedded_corpus_documents
    from depthattn.data.tokenizer import train_bpe

    return train_bpe([embedded_corpus_documents()[0][1][:20000]], vocab_size=VOCAB)


@FAST
@given(prompt=st.text(st.characters(codec=None, categories=None), min_size=0, max_size=12))
def test_any_prompt_generates_text_or_one_value_error(model, tokenizer, prompt):
    """Arbitrary Unicode, lone surrogates and control characters included, through the tokenizer and generate."""
    from depthattn.generate import generate_text

    try:
        text = generate_text(model, tokenizer, prompt, max_new_tokens=2, temperature=0, seed=0)
    except ValueError as e:
        msg = str(e)
        assert "\n" not in msg
        if any(0xD800 <= ord(c) <= 0xDFFF for c in prompt):
            assert msg.startswith("prompt is not valid UTF-8 text")
        else:
            assert msg == "--prompt must not be empty" and tokenizer.encode(prompt).ids == []
        return
    assert isinstance(text, str)
    text.encode("utf-8")  # printable: valid Unicode


@FAST
@given(text=st.text(st.characters(codec=None, categories=None), max_size=20))
def test_check_text_accepts_exactly_the_encodable_strings(text):
    try:
        text.encode("utf-8")
        ok = True
    except UnicodeEncodeError:
        ok = False
    if ok:
        check_text(text, "--prompt")
    else:
        with pytest.raises(ValueError, match="^--prompt is not valid UTF-8 text: "):
            check_text(text, "--prompt")
