"""Checkpoints in other layouts: the paper's (gates packed per key/value group into a wider `q_proj`) and
Qwen3-Next's (query and gate interleaved per head), converted to and from ours.

The references here are written from the published formulas, independently of the converters: tiny paper
checkpoints are packed by hand (`_pack_by_hand`), and `_paper_reference_logits` / `_qwen3_next_reference`
compute the forward pass as the paper's and Qwen3-Next's code do.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import tiny_model
from layout_references import (
    GROUP,
    HEAD_DIM,
    HEADS,
    HIDDEN,
    KV_HEADS,
    LAYERS,
    VOCAB,
    causal_attention,
    rms_norm,
    rope,
    rotate,
)
from safetensors.torch import load_file, save_file
from torch.nn import functional as F

import hf_gate_attention
from hf_gate_attention import GateConfig, gate_config_of, patch
from hf_gate_attention.cli import main
from hf_gate_attention.sharing.layouts import (
    load_paper_checkpoint,
    ours_to_qwen3_next_attention,
    pack_q_proj,
    qwen3_next_attention_to_ours,
    save_in_paper_layout,
    split_q_proj,
)
from hf_gate_attention.sharing.loading import load_model
from hf_gate_attention.sharing.statistics import checkpoint_statistics

INPUT_IDS = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(3))
PAPER_CASES = [
    (granularity, qkv_bias, use_qk_norm)
    for granularity in ("headwise", "elementwise")
    for qkv_bias in (False, True)
    for use_qk_norm in (True, False)
]


# ---- a tiny checkpoint in the paper's layout, and its forward from the paper's formulas ------------------


def _paper_config(granularity: str, qkv_bias: bool, use_qk_norm: bool, **overrides) -> dict:
    """A config.json as the paper's checkpoints have it (their auto_map; `attention_bias` unread by them)."""
    return {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "auto_map": {"AutoModelForCausalLM": "modeling_qwen3.Qwen3ForCausalLM"},
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": 37,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "qkv_bias": qkv_bias,
        "use_qk_norm": use_qk_norm,
        "headwise_attn_output_gate": granularity == "headwise",
        "elementwise_attn_output_gate": granularity == "elementwise",
        **overrides,
    }


def _pack_by_hand(query: torch.Tensor, gate: torch.Tensor, gate_width: int) -> torch.Tensor:
    """The paper's q_proj rows: for each key/value group, its G*D query rows then its G*w gate rows."""
    rows = []
    for group in range(KV_HEADS):
        rows.append(query[group * GROUP * HEAD_DIM : (group + 1) * GROUP * HEAD_DIM])
        rows.append(gate[group * GROUP * gate_width : (group + 1) * GROUP * gate_width])
    return torch.cat(rows)


def _paper_tensors(config: dict, seed: int = 0) -> dict:
    """Random weights in the paper's layout for `config` (float32)."""
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.2):
        return torch.randn(*shape, generator=generator) * scale

    def norm(size):
        return 1 + rand(size, scale=0.1)

    gate_width = 1 if config["headwise_attn_output_gate"] else HEAD_DIM
    bias = config["qkv_bias"]
    tensors = {"model.embed_tokens.weight": rand(VOCAB, HIDDEN, scale=1.0), "model.norm.weight": norm(HIDDEN)}
    if not config["tie_word_embeddings"]:
        tensors["lm_head.weight"] = rand(VOCAB, HIDDEN)
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        attention = prefix + "self_attn."
        tensors[prefix + "input_layernorm.weight"] = norm(HIDDEN)
        tensors[prefix + "post_attention_layernorm.weight"] = norm(HIDDEN)
        query, gate = rand(HEADS * HEAD_DIM, HIDDEN), rand(HEADS * gate_width, HIDDEN, scale=0.5)
        tensors[attention + "q_proj.weight"] = _pack_by_hand(query, gate, gate_width)
        widths = {"k_proj": KV_HEADS * HEAD_DIM, "v_proj": KV_HEADS * HEAD_DIM, "o_proj": HIDDEN}
        for name, rows in widths.items():
            tensors[attention + f"{name}.weight"] = rand(
                rows, HIDDEN if name != "o_proj" else HEADS * HEAD_DIM
            )
        if bias:
            query_bias, gate_bias = rand(HEADS * HEAD_DIM), rand(HEADS * gate_width, scale=1.0)
            tensors[attention + "q_proj.bias"] = _pack_by_hand(query_bias, gate_bias, gate_width)
            for name, rows in widths.items():
                tensors[attention + f"{name}.bias"] = rand(rows)
        if config["use_qk_norm"]:
            tensors[attention + "q_norm.weight"] = norm(HEAD_DIM)
            tensors[attention + "k_norm.weight"] = norm(HEAD_DIM)
        tensors[prefix + "mlp.gate_proj.weight"] = rand(37, HIDDEN)
        tensors[prefix + "mlp.up_proj.weight"] = rand(37, HIDDEN)
        tensors[prefix + "mlp.down_proj.weight"] = rand(HIDDEN, 37)
    return tensors


def _write_checkpoint(folder, config: dict, tensors: dict):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def _paper_reference_logits(config: dict, t: dict, input_ids: torch.Tensor) -> torch.Tensor:
    """The paper's Qwen3 forward (github qiuzh20/gated_attention, modeling_qwen3.py) from its formulas."""
    batch, length = input_ids.shape
    gate_width = 1 if config["headwise_attn_output_gate"] else HEAD_DIM
    cos, sin = rope(length)
    x = t["model.embed_tokens.weight"][input_ids]
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."

        def linear(name, inputs, prefix=prefix):
            return F.linear(inputs, t[prefix + name + ".weight"], t.get(prefix + name + ".bias"))

        h = rms_norm(x, t[prefix + "input_layernorm.weight"])
        q = linear("self_attn.q_proj", h).view(batch, length, KV_HEADS, -1)  # per group: [G*D | G*w]
        q, gate = q.split([GROUP * HEAD_DIM, GROUP * gate_width], dim=-1)
        gate = gate.reshape(batch, length, HEADS, gate_width)
        q = q.reshape(batch, length, HEADS, HEAD_DIM)
        k = linear("self_attn.k_proj", h).view(batch, length, KV_HEADS, HEAD_DIM)
        v = linear("self_attn.v_proj", h).view(batch, length, KV_HEADS, HEAD_DIM)
        if config["use_qk_norm"]:
            q = rms_norm(q, t[prefix + "self_attn.q_norm.weight"])
            k = rms_norm(k, t[prefix + "self_attn.k_norm.weight"])
        out = causal_attention(rotate(q, cos, sin), rotate(k, cos, sin), v) * torch.sigmoid(gate)
        x = x + linear("self_attn.o_proj", out.reshape(batch, length, HEADS * HEAD_DIM))
        h = rms_norm(x, t[prefix + "post_attention_layernorm.weight"])
        x = x + linear("mlp.down_proj", F.silu(linear("mlp.gate_proj", h)) * linear("mlp.up_proj", h))
    x = rms_norm(x, t["model.norm.weight"])
    return F.linear(x, t.get("lm_head.weight", t["model.embed_tokens.weight"]))


@pytest.fixture(scope="module")
def paper_checkpoints(tmp_path_factory) -> dict:
    """(granularity, qkv_bias, use_qk_norm) -> (folder, config, tensors) of every case of PAPER_CASES."""
    root = tmp_path_factory.mktemp("paper")
    checkpoints = {}
    for seed, case in enumerate(PAPER_CASES):
        config = _paper_config(*case)
        tensors = _paper_tensors(config, seed)
        folder = _write_checkpoint(root / "-".join(map(str, case)), config, tensors)
        checkpoints[case] = (folder, config, tensors)
    return checkpoints


def _logits(model, input_ids=INPUT_IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids).logits


# ---- the paper's layout ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", PAPER_CASES, ids=lambda case: "-".join(map(str, case)))
def test_paper_checkpoint_loads_with_the_logits_of_the_papers_formulas(paper_checkpoints, case):
    granularity, qkv_bias, use_qk_norm = case
    folder, config, tensors = paper_checkpoints[case]
    model = load_paper_checkpoint(str(folder), attn_implementation="eager")
    assert type(model).__name__ == ("Qwen3ForCausalLM" if use_qk_norm else "LlamaForCausalLM")
    assert model.config.attention_bias is qkv_bias
    assert gate_config_of(model) == GateConfig(variant="output", granularity=granularity, init="paper")
    assert not any(key in model.config.to_dict() for key in ("qkv_bias", "use_qk_norm", "auto_map"))
    expected = _paper_reference_logits(config, tensors, INPUT_IDS)
    torch.testing.assert_close(_logits(model), expected, rtol=1e-5, atol=1e-5)


def test_logit_check_detects_gates_of_the_wrong_group(paper_checkpoints):
    """The comparison above is sensitive to the group order: swapping the two key/value groups' gate rows
    (what a converter reading `[all queries | all gates]` or the wrong group would do) changes the logits."""
    folder, config, tensors = paper_checkpoints[("headwise", True, True)]
    model = load_paper_checkpoint(str(folder), attn_implementation="eager")
    gate = model.model.layers[0].self_attn.attn_gate
    with torch.no_grad():
        gate.weight.copy_(gate.weight.roll(GROUP, dims=0))  # the first group's gates <-> the second's
    assert (_logits(model) - _paper_reference_logits(config, tensors, INPUT_IDS)).abs().max() > 1e-3


def test_from_pretrained_recognises_a_paper_checkpoint(paper_checkpoints):
    folder, config, tensors = paper_checkpoints[("elementwise", False, True)]
    model = hf_gate_attention.from_pretrained(str(folder), attn_implementation="eager")
    assert gate_config_of(model).granularity == "elementwise"
    torch.testing.assert_close(
        _logits(model), _paper_reference_logits(config, tensors, INPUT_IDS), rtol=1e-5, atol=1e-5
    )


def test_paper_checkpoint_with_tied_embeddings(tmp_path):
    config = _paper_config("headwise", False, True, tie_word_embeddings=True)
    tensors = _paper_tensors(config)
    model = load_paper_checkpoint(str(_write_checkpoint(tmp_path / "src", config, tensors)))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    expected = _paper_reference_logits(config, tensors, INPUT_IDS)
    torch.testing.assert_close(_logits(model), expected, rtol=1e-5, atol=1e-5)
    save_in_paper_layout(model, tmp_path / "back")
    assert load_file(tmp_path / "back" / "model.safetensors").keys() == tensors.keys()


@pytest.mark.parametrize("case", PAPER_CASES, ids=lambda case: "-".join(map(str, case)))
def test_paper_to_ours_to_paper_is_bit_exact(paper_checkpoints, tmp_path, case):
    folder, config, tensors = paper_checkpoints[case]
    save_in_paper_layout(load_paper_checkpoint(str(folder)), tmp_path / "back")
    back = load_file(tmp_path / "back" / "model.safetensors")
    assert back.keys() == tensors.keys()
    assert all(torch.equal(back[key], tensors[key]) for key in tensors)
    saved = json.loads((tmp_path / "back" / "config.json").read_text())
    paper_keys = ("headwise_attn_output_gate", "elementwise_attn_output_gate", "use_qk_norm", "qkv_bias")
    geometry = ("num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size", "rope_theta")
    assert {key: saved[key] for key in (*paper_keys, *geometry, "model_type", "architectures")} == {
        key: config[key] for key in (*paper_keys, *geometry, "model_type", "architectures")
    }


def _gated(model_type: str, granularity: str, seed: int, **config) -> torch.nn.Module:
    """A tiny patched causal LM with random gate weights and biases (`init="paper"`)."""
    model = patch(
        tiny_model(model_type, seed=seed, **config), GateConfig(granularity=granularity, init="paper")
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("attn_gate.bias") or name.endswith("_proj.bias"):
                param.copy_(torch.randn(param.shape, generator=generator))
    return model


@pytest.mark.parametrize(
    ("model_type", "granularity", "attention_bias"),
    [("qwen3", "elementwise", True), ("llama", "headwise", True), ("qwen3", "headwise", False)],
)
def test_ours_to_paper_to_ours_is_bit_exact(tmp_path, model_type, granularity, attention_bias):
    model = _gated(model_type, granularity, seed=5, attention_bias=attention_bias)
    if not attention_bias:  # without attention bias the layout holds a gate bias only if it is zero
        for block in model.model.layers:
            block.self_attn.attn_gate.bias.data.zero_()
    save_in_paper_layout(model, tmp_path / "paper")
    saved = json.loads((tmp_path / "paper" / "config.json").read_text())
    assert saved[f"{granularity}_attn_output_gate"] and saved["qkv_bias"] is attention_bias
    again = load_paper_checkpoint(str(tmp_path / "paper"), attn_implementation="eager")
    assert type(again) is type(model) and gate_config_of(again) == gate_config_of(model)
    before, after = model.state_dict(), again.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[key], after[key]) for key in before)
    assert torch.equal(_logits(again), _logits(model))


def test_nonzero_gate_bias_without_attention_bias_is_exported_with_zero_biases(tmp_path):
    model = _gated("llama", "elementwise", seed=6)
    save_in_paper_layout(model, tmp_path / "paper")
    assert json.loads((tmp_path / "paper" / "config.json").read_text())["qkv_bias"] is True
    again = load_paper_checkpoint(str(tmp_path / "paper"), attn_implementation="eager")
    state = again.state_dict()
    for key, tensor in model.state_dict().items():
        assert torch.equal(state[key], tensor)
    extra = set(state) - set(model.state_dict())
    assert extra and all(key.endswith("_proj.bias") and not state[key].any() for key in extra)
    torch.testing.assert_close(_logits(again), _logits(model), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("gate", "overrides", "message"),
    [
        (GateConfig(init="identity"), {}, "init='identity': its gate is 2*sigmoid(z)"),
        (GateConfig(variant="value", init="paper"), {}, "variant='value'"),
        (GateConfig(init="paper", top_k=1), {}, "top_k=1"),
        (GateConfig(init="paper", layers=(1,)), {}, "gates on layers [1] only"),
        (GateConfig(init="paper"), {"mlp_bias": True}, "mlp_bias=true"),
    ],
)
def test_export_refuses_what_the_paper_layout_cannot_represent(tmp_path, gate, overrides, message):
    model = patch(tiny_model("llama", **overrides), gate)
    with pytest.raises(ValueError, match="the paper's layout cannot represent this model") as error:
        save_in_paper_layout(model, tmp_path / "out")
    assert message in str(error.value)
    assert not (tmp_path / "out").exists()


def test_export_refuses_other_model_types_and_unpatched_models(tmp_path):
    with pytest.raises(ValueError, match="model_type 'mistral' \\(accepted: qwen3, llama\\)"):
        save_in_paper_layout(patch(tiny_model("mistral"), GateConfig(init="paper")), tmp_path / "out")
    with pytest.raises(ValueError, match="not patched with gated attention"):
        save_in_paper_layout(tiny_model("qwen3"), tmp_path / "out")


# ---- bad input ------------------------------------------------------------------------------------------


def _load_edited(tmp_path, config_overrides: dict | None = None, edit=None):
    """Load a paper checkpoint whose config or tensors were edited."""
    config = _paper_config("headwise", False, True, **(config_overrides or {}))
    tensors = _paper_tensors(_paper_config("headwise", False, True))
    if edit is not None:
        edit(tensors)
    return load_paper_checkpoint(str(_write_checkpoint(tmp_path / "edited", config, tensors)))


def test_q_proj_width_of_no_layout_names_every_expected_width(tmp_path):
    def widen(tensors):
        tensors["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(2 * HEADS * HEAD_DIM, HIDDEN)

    with pytest.raises(ValueError) as error:
        _load_edited(tmp_path, edit=widen)
    assert str(error.value) == (
        "q_proj has 64 output rows, which is not the paper headwise layout: for 4 heads, 2 key/value heads "
        "and head_dim 8 the layouts expect plain 32, paper headwise 36, paper elementwise 64, qwen3_next 64"
    )


def test_heads_not_divisible_by_key_value_heads(tmp_path):
    with pytest.raises(ValueError, match="num_attention_heads=4 is not a multiple of num_key_value_heads=3"):
        _load_edited(tmp_path, {"num_key_value_heads": 3})


def test_o_proj_width_inconsistent_with_the_heads(tmp_path):
    def narrow(tensors):
        tensors["model.layers.1.self_attn.o_proj.weight"] = torch.zeros(HIDDEN, 24)

    with pytest.raises(
        ValueError, match=r"model.layers.1.self_attn.o_proj takes 24 inputs but .* = 4 \* 8 = 32"
    ):
        _load_edited(tmp_path, edit=narrow)


def test_both_paper_flags_set(tmp_path):
    with pytest.raises(
        ValueError, match="sets both headwise_attn_output_gate and elementwise_attn_output_gate"
    ):
        _load_edited(tmp_path, {"elementwise_attn_output_gate": True})


def test_ungated_checkpoint_given_to_the_paper_converter(tmp_path):
    with pytest.raises(ValueError, match="sets neither of headwise_attn_output_gate and elementwise"):
        _load_edited(tmp_path, {"headwise_attn_output_gate": False})
    tiny_model("qwen3").save_pretrained(tmp_path / "plain")
    with pytest.raises(ValueError, match="sets neither of"):
        load_paper_checkpoint(str(tmp_path / "plain"))


def test_a_missing_tensor_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"missing \['model.layers.0.mlp.up_proj.weight'\], unexpected \[\]"):
        _load_edited(tmp_path, edit=lambda tensors: tensors.pop("model.layers.0.mlp.up_proj.weight"))


@pytest.mark.parametrize("layout", ["paper", "qwen3_next"])
def test_split_and_pack_are_inverse(layout):
    rows = HEADS * HEAD_DIM + (HEADS * HEAD_DIM if layout == "qwen3_next" else HEADS)
    granularity = "elementwise" if layout == "qwen3_next" else "headwise"
    packed = torch.randn(rows, HIDDEN)
    query, gate = split_q_proj(packed, layout, HEADS, KV_HEADS, HEAD_DIM, granularity=granularity)
    assert query.shape == (HEADS * HEAD_DIM, HIDDEN)
    assert torch.equal(pack_q_proj(query, gate, layout, HEADS, KV_HEADS, HEAD_DIM), packed)


# ---- command line ---------------------------------------------------------------------------------------


def test_cli_convert_both_ways(paper_checkpoints, tmp_path, capsys):
    folder, config, tensors = paper_checkpoints[("headwise", True, False)]
    assert main(["convert", str(folder), str(tmp_path / "ours")]) == 0
    assert "Wrote LlamaForCausalLM (headwise gates) in our layout" in capsys.readouterr().out
    assert (tmp_path / "ours" / "modeling_gated_attention.py").is_file()
    model = hf_gate_attention.from_pretrained(str(tmp_path / "ours"), attn_implementation="eager")
    expected = _paper_reference_logits(config, tensors, INPUT_IDS)
    torch.testing.assert_close(_logits(model), expected, rtol=1e-5, atol=1e-5)

    assert main(["convert", str(tmp_path / "ours"), str(tmp_path / "paper"), "--to", "paper"]) == 0
    back = load_file(tmp_path / "paper" / "model.safetensors")
    assert back.keys() == tensors.keys() and all(torch.equal(back[key], tensors[key]) for key in tensors)


def test_cli_convert_bad_input_exits_with_one_line(tmp_path, capsys):
    tiny_model("qwen3").save_pretrained(tmp_path / "plain")
    patch(tiny_model("qwen3"), GateConfig()).save_pretrained(tmp_path / "identity")
    capsys.readouterr()  # transformers' progress bars
    cases = [
        (["convert", str(tmp_path / "plain"), str(tmp_path / "out")], "sets neither of"),
        (["convert", str(tmp_path / "identity"), str(tmp_path / "out"), "--to", "paper"], "init='identity'"),
        (
            ["convert", str(tmp_path / "plain"), str(tmp_path / "identity")],
            "exists and is not an empty folder",
        ),
    ]
    for argv, message in cases:
        assert main(argv) == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' loading progress bar
        assert last.startswith("hf-gate-attention: error:") and message in last
    assert not (tmp_path / "out").exists()


def test_public_names_are_lazy_exports():
    for name in ("load_paper_checkpoint", "save_in_paper_layout"):
        assert getattr(hf_gate_attention, name) is globals()[name]
    assert hf_gate_attention.qwen3_next_attention_to_ours is qwen3_next_attention_to_ours
    assert hf_gate_attention.ours_to_qwen3_next_attention is ours_to_qwen3_next_attention


@pytest.mark.parametrize("qkv_bias", [True, False])
def test_info_and_load_model_read_the_papers_layout_and_its_conversion(paper_checkpoints, tmp_path, qkv_bias):
    folder, config, tensors = paper_checkpoints[("headwise", qkv_bias, True)]
    paper = checkpoint_statistics(folder)
    assert paper["layout"] == "paper" and paper["gate"]["init"] == "paper"
    assert paper["total_params"] == sum(t.numel() for t in tensors.values())
    layers, heads, hidden = config["num_hidden_layers"], config["num_attention_heads"], config["hidden_size"]
    assert paper["gated_layers"] == layers
    assert paper["added_params"] == layers * heads * (hidden + qkv_bias)  # gate rows of q_proj (and bias)
    assert main(["convert", str(folder), str(tmp_path / "ours")]) == 0
    ours = checkpoint_statistics(tmp_path / "ours")
    assert ours["layout"] == "ours" and ours["gate"] == paper["gate"]
    assert ours["layers"].keys() == paper["layers"].keys()
    assert all(ours["layers"][block] == paper["layers"][block] for block in ours["layers"])

    model = load_model(str(folder), backend="torch", attn_implementation="eager")  # what diagnose loads
    expected = _paper_reference_logits(config, tensors, INPUT_IDS)
    torch.testing.assert_close(_logits(model), expected, rtol=1e-5, atol=1e-5)
