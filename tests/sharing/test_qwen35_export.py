"""A patched qwen3 causal LM written as a transformers Qwen3.5 text checkpoint (`Qwen3_5ForCausalLM`, every
layer full attention) and read back: loaded with plain transformers, the checkpoint computes what the gated
model computes (random gates, norms and biases, so that a misplaced row or a missed shift shows)."""

from __future__ import annotations

import json
import re

import pytest
import torch
import transformers
from helpers import tiny_model
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers

import hf_gate_attention
from hf_gate_attention import GateConfig, patch
from hf_gate_attention.cli import main
from hf_gate_attention.sharing.layouts import (
    load_qwen3_5_checkpoint,
    qwen3_5_state_dict,
    save_as_qwen3_5,
    write_qwen3_5_checkpoint,
)

INPUT_IDS = torch.randint(3, 99, (2, 11), generator=torch.Generator().manual_seed(1))
ENGINE_KEYS = (
    "full_attention_interval",
    "partial_rotary_factor",
    "rope_theta",
    "attn_output_gate",
    "qkv_bias",
)


def _gated(granularity="elementwise", init="paper", biases=True, attention_bias=False, **config):
    """A tiny patched qwen3 with random gates, norms around 1 and (with `biases`) random attention biases."""
    model = patch(
        tiny_model("qwen3", attention_bias=attention_bias, **config),
        GateConfig(granularity=granularity, init=init),
    )
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * noise)
            elif name.endswith(".bias"):
                param.copy_(0.3 * noise if biases else torch.zeros_like(param))
            elif ".attn_gate." in name:
                param.copy_(0.5 * noise)
    return model


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(INPUT_IDS).logits


def _greedy(model) -> torch.Tensor:
    return model.generate(INPUT_IDS, max_new_tokens=8, do_sample=False, pad_token_id=0)


def _plain_load(folder):
    """The checkpoint as anyone loads it: transformers alone, no remote code."""
    return transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()


def _check_plain_checkpoint(folder, attention_bias: bool) -> dict:
    assert not list(folder.glob("*.py"))
    config = json.loads((folder / "config.json").read_text())
    assert "auto_map" not in config and "gate_attention" not in config
    assert config["model_type"] == "qwen3_5_text" and config["architectures"] == ["Qwen3_5ForCausalLM"]
    assert set(config["layer_types"]) == {"full_attention"}
    assert config["rope_parameters"]["partial_rotary_factor"] == 1.0
    assert {key: config[key] for key in ENGINE_KEYS} == {
        "full_attention_interval": 1,
        "partial_rotary_factor": 1.0,
        "rope_theta": config["rope_parameters"]["rope_theta"],
        "attn_output_gate": True,
        "qkv_bias": attention_bias,
    }
    assert config["attention_bias"] is attention_bias
    return config


@pytest.mark.parametrize("attention_bias", [False, True])
@pytest.mark.parametrize("init", ["identity", "paper"])
@pytest.mark.parametrize("granularity", ["headwise", "elementwise"])
def test_qwen3_5_checkpoint_computes_the_same(granularity, init, attention_bias, tmp_path):
    model = _gated(granularity, init, biases=True, attention_bias=attention_bias)
    write_qwen3_5_checkpoint(model, tmp_path, keep_biases=True)
    _check_plain_checkpoint(tmp_path, attention_bias=True)  # the gate bias needs q_proj.bias
    loaded = _plain_load(tmp_path)
    assert type(loaded).__name__ == "Qwen3_5ForCausalLM"
    torch.testing.assert_close(_logits(loaded), _logits(model), rtol=0, atol=1e-5)
    assert torch.equal(_greedy(loaded), _greedy(model))


@pytest.mark.parametrize("attention_bias", [False, True])
def test_zero_biases_are_left_out_and_tied_embeddings_kept(attention_bias, tmp_path):
    model = _gated(
        "headwise", "identity", biases=False, attention_bias=attention_bias, tie_word_embeddings=True
    )
    save_as_qwen3_5(model, tmp_path / "out")
    _check_plain_checkpoint(tmp_path / "out", attention_bias=False)
    tensors = load_file(tmp_path / "out" / "model.safetensors")
    assert not [key for key in tensors if key.endswith(".bias")] and "lm_head.weight" not in tensors
    loaded = _plain_load(tmp_path / "out")
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    torch.testing.assert_close(_logits(loaded), _logits(model), rtol=0, atol=1e-5)
    assert torch.equal(_greedy(loaded), _greedy(model))


def test_norms_are_zero_centred_and_the_gate_packed_per_head():
    model = _gated("headwise", "identity", biases=False)
    state, config = qwen3_5_state_dict(model)
    ours = model.state_dict()
    heads, head_dim = config.num_attention_heads, config.head_dim
    for key in (
        "model.norm.weight",
        "model.layers.1.input_layernorm.weight",
        "model.layers.0.self_attn.k_norm.weight",
    ):
        torch.testing.assert_close(state[key] + 1, ours[key], rtol=0, atol=1e-6)
    q_proj = state["model.layers.0.self_attn.q_proj.weight"].unflatten(0, (heads, 2 * head_dim))
    gate = ours["model.layers.0.self_attn.attn_gate.weight"]  # (H, hidden): one row per head
    assert torch.equal(q_proj[:, head_dim:], gate[:, None].expand(-1, head_dim, -1))
    assert torch.equal(q_proj[:, :head_dim].flatten(0, 1), ours["model.layers.0.self_attn.q_proj.weight"])
    o_proj = "model.layers.0.self_attn.o_proj.weight"
    assert torch.equal(state[o_proj], 2 * ours[o_proj])  # init="identity": 2 * sigmoid(z)


def test_public_names_are_lazy_exports():
    assert hf_gate_attention.save_as_qwen3_5 is save_as_qwen3_5
    assert hf_gate_attention.load_qwen3_5_checkpoint is load_qwen3_5_checkpoint


def test_round_trip_through_qwen3_5(tmp_path):
    model = _gated("elementwise", "paper", biases=True)
    write_qwen3_5_checkpoint(model, tmp_path / "qwen3_5", keep_biases=True)
    back = load_qwen3_5_checkpoint(str(tmp_path / "qwen3_5"), backend="torch")
    assert type(back).__name__ == "Qwen3ForCausalLM"
    gate = hf_gate_attention.core.patching.gate_config_of(back)
    assert (gate.variant, gate.granularity, gate.init) == ("output", "elementwise", "paper")
    torch.testing.assert_close(_logits(back), _logits(model), rtol=0, atol=1e-5)
    write_qwen3_5_checkpoint(back, tmp_path / "again", keep_biases=True)
    first, again = (load_file(tmp_path / name / "model.safetensors") for name in ("qwen3_5", "again"))
    assert first.keys() == again.keys() and all(torch.equal(first[key], again[key]) for key in first)


def test_refusals_say_what_is_wrong():
    cases = [
        (tiny_model("qwen3"), "not patched with gated attention; nothing to export in Qwen3.5's layout"),
        (patch(tiny_model("llama"), GateConfig()), re.escape("model_type 'llama' (accepted: 'qwen3'")),
        (
            patch(tiny_model("qwen3"), GateConfig(variant="value")),
            re.escape("variant='value' (Qwen3.5 gates the attention output"),
        ),
        (patch(tiny_model("qwen3"), GateConfig(top_k=1)), re.escape("top_k=1 (Qwen3.5's gates are dense)")),
        (
            patch(tiny_model("qwen3"), GateConfig(layers=(1,))),
            r"gates on layers \[1\] only .* 1 ungated layers",
        ),
        (
            patch(
                tiny_model("qwen3", use_sliding_window=True, sliding_window=4, max_window_layers=1),
                GateConfig(),
            ),
            r"layers \[1\] use sliding-window attention",
        ),
        (_gated(biases=True), "nonzero attention biases .*attn_gate.bias.* pass keep_biases=True"),
    ]
    for model, message in cases:
        with pytest.raises(ValueError, match=message):
            qwen3_5_state_dict(model)


def _write_config(folder, **keys):
    config = transformers.Qwen3_5TextConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, **keys
    )
    config.save_pretrained(folder)
    return str(folder)


def test_reading_refuses_what_a_gated_qwen3_cannot_hold(tmp_path):
    with pytest.raises(ValueError, match=r"layers \[0\] of this Qwen3.5 checkpoint are 'linear_attention'"):
        load_qwen3_5_checkpoint(_write_config(tmp_path / "hybrid", full_attention_interval=2))
    partial = _write_config(tmp_path / "partial", layer_types=["full_attention"] * 2)  # rotary factor 0.25
    with pytest.raises(ValueError, match=r"partial_rotary_factor 0.25 \(Qwen3-Next\) != 1.0"):
        load_qwen3_5_checkpoint(partial)
    _gated().save_pretrained(tmp_path / "ours")
    with pytest.raises(ValueError, match="model_type='gated_qwen3', not 'qwen3_5_text'"):
        load_qwen3_5_checkpoint(str(tmp_path / "ours"))


def _save_tokenizer(folder):
    vocab = {f"w{i}": i for i in range(99)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="w0").save_pretrained(folder)


def test_cli_convert_to_qwen3_5_and_back(tmp_path, capsys):
    model = _gated("headwise", "identity", biases=True)
    model.save_pretrained(tmp_path / "ours")
    _save_tokenizer(tmp_path / "ours")
    argv = ["convert", str(tmp_path / "ours"), str(tmp_path / "qwen3_5"), "--to", "qwen3_5"]
    capsys.readouterr()
    assert main(argv) == 2
    assert "pass keep_biases=True (--keep-biases)" in capsys.readouterr().err.strip().splitlines()[-1]
    assert main([*argv, "--keep-biases"]) == 0
    assert "Wrote Qwen3ForCausalLM (headwise gates) in Qwen3.5's layout" in capsys.readouterr().out
    assert (tmp_path / "qwen3_5" / "tokenizer.json").is_file()
    _check_plain_checkpoint(tmp_path / "qwen3_5", attention_bias=True)
    torch.testing.assert_close(_logits(_plain_load(tmp_path / "qwen3_5")), _logits(model), rtol=0, atol=1e-5)

    assert (
        main(["convert", str(tmp_path / "qwen3_5"), str(tmp_path / "back")]) == 0
    )  # --to ours: read off model_type
    assert "Wrote Qwen3ForCausalLM (elementwise gates) in our layout" in capsys.readouterr().out
    back = hf_gate_attention.from_pretrained(str(tmp_path / "back"), attn_implementation="eager")
    torch.testing.assert_close(_logits(back), _logits(model), rtol=0, atol=1e-5)
    assert (
        main(["convert", str(tmp_path / "ours"), str(tmp_path / "paper"), "--to", "paper", "--keep-biases"])
        == 2
    )
    assert "--keep-biases applies to --to qwen3_5 only" in capsys.readouterr().err
