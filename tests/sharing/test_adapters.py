"""Gate-only adapters (`sharing/adapters.py`): save, load and push gate tensors (+ a PEFT LoRA) of a model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from helpers import first_output, tiny_inputs, tiny_model
from hub_server import TOKEN
from huggingface_hub import ModelCard
from safetensors.torch import load_file
from test_hub import REPO_ROOT, client_env, folder_files, hub  # noqa: F401 (hub: the fake Hub fixture)

import hf_gate_attention
from hf_gate_attention import GateConfig, adapter_info, load_gate_adapter, patch, save_gate_adapter
from hf_gate_attention.sharing import adapters
from hf_gate_attention.sharing.hub import upload

peft = pytest.importorskip("peft")

GATE_FILES = {adapters.GATE_CONFIG_NAME, adapters.GATE_WEIGHTS_NAME}
LORA_FILES = {adapters.LORA_CONFIG_NAME, adapters.LORA_WEIGHTS_NAME}
LORA_TARGETS = {"llama": ["q_proj", "o_proj"], "vit": ["q_proj", "o_proj"], "bert": ["query", "dense"]}


def trained_gates(model_type: str, variant: str = "output", **overrides):
    """A tiny patched model whose gates differ from any init (as after training), and its ungated logits."""
    model = tiny_model(model_type, **overrides)
    with torch.no_grad():
        plain = first_output(model(**tiny_inputs(model_type)))
    patch(model, GateConfig(variant=variant, granularity="elementwise"))
    with torch.no_grad():
        for param in hf_gate_attention.gate_parameters(model):
            param.copy_(torch.randn_like(param))
    return model, plain


def with_lora(model, model_type: str, gates_in_adapter: bool):
    """A PEFT LoRA model over a patched model, its LoRA (and gate copies) moved away from their init."""
    config = peft.LoraConfig(
        r=2,
        target_modules=LORA_TARGETS[model_type],
        modules_to_save=["attn_gate"] if gates_in_adapter else None,
        init_lora_weights=False,
    )
    peft_model = peft.get_peft_model(model, config)
    with torch.no_grad():
        for param in peft_model.parameters():
            if param.requires_grad:
                param.add_(0.3 * torch.randn_like(param))
    return peft_model.eval()


def logits(model, model_type: str) -> torch.Tensor:
    with torch.no_grad():
        return first_output(model(**tiny_inputs(model_type)))


@pytest.mark.parametrize("model_type", ["llama", "bert"])
def test_gates_only_adapter_reproduces_the_gated_model(model_type, tmp_path):
    model, plain = trained_gates(model_type, variant="qk" if model_type == "bert" else "output")
    expected = logits(model, model_type)
    assert not torch.allclose(expected, plain)  # the gates matter

    save_gate_adapter(model, tmp_path / "a", base_model_name_or_path="org/base", base_revision="v1")
    assert {p.name for p in (tmp_path / "a").iterdir()} == GATE_FILES
    saved = load_file(tmp_path / "a" / adapters.GATE_WEIGHTS_NAME)
    state = model.state_dict()
    assert saved.keys() == {k for k in state if ".attn_gate." in k} and len(saved) == 4
    assert all(torch.equal(tensor, state[key]) for key, tensor in saved.items())

    loaded = load_gate_adapter(tiny_model(model_type, seed=0), tmp_path / "a")
    assert hf_gate_attention.gate_config_of(loaded) == hf_gate_attention.gate_config_of(model)
    assert torch.equal(logits(loaded, model_type), expected)

    save_gate_adapter(loaded, tmp_path / "b")  # the base reference comes with the loaded adapter
    assert folder_files(tmp_path / "b") == folder_files(tmp_path / "a")
    save_gate_adapter(loaded, tmp_path / "c", base_model_name_or_path="org/other")  # not org/base's revision
    assert adapter_info(tmp_path / "c")["revision"] is None


@pytest.mark.parametrize(("model_type", "gates_in_adapter"), [("llama", True), ("vit", False)])
def test_gates_and_lora_adapter_reproduces_the_peft_model(model_type, gates_in_adapter, tmp_path):
    model, plain = trained_gates(model_type)
    peft_model = with_lora(model, model_type, gates_in_adapter)
    expected = logits(peft_model, model_type)

    save_gate_adapter(peft_model, tmp_path / "a", base_model_name_or_path="org/base")
    if gates_in_adapter:  # PEFT trains copies of the gates: those are saved, not the patched originals
        gate = peft_model.get_base_model().model.layers[1].self_attn.attn_gate
        trained, original = gate.modules_to_save["default"].weight, gate.original_module.weight
        saved = load_file(tmp_path / "a" / adapters.GATE_WEIGHTS_NAME)[
            "model.layers.1.self_attn.attn_gate.weight"
        ]
        assert torch.equal(saved, trained) and not torch.equal(saved, original)
    assert {p.name for p in (tmp_path / "a").iterdir()} == GATE_FILES | LORA_FILES
    lora_config = json.loads((tmp_path / "a" / adapters.LORA_CONFIG_NAME).read_text())
    assert lora_config["peft_type"] == "LORA" and lora_config["base_model_name_or_path"] == "org/base"
    assert lora_config["target_modules"] == sorted(LORA_TARGETS[model_type])

    loaded = load_gate_adapter(tiny_model(model_type, seed=0), tmp_path / "a")
    assert isinstance(loaded, peft.PeftModel)
    assert torch.equal(logits(loaded, model_type), expected)
    assert not torch.allclose(logits(loaded, model_type), plain)

    save_gate_adapter(loaded, tmp_path / "b")
    assert folder_files(tmp_path / "b") == folder_files(tmp_path / "a")

    # the LoRA files are PEFT's own: PEFT loads them onto a base patched with the adapter's gates
    base = tiny_model(model_type, seed=0)
    patch(base, hf_gate_attention.gate_config_of(model))
    base.load_state_dict(load_file(tmp_path / "a" / adapters.GATE_WEIGHTS_NAME), strict=False)
    assert torch.equal(logits(peft.PeftModel.from_pretrained(base, tmp_path / "a"), model_type), expected)


def test_saving_gates_only_over_a_lora_folder_removes_the_lora_files(tmp_path):
    model, _ = trained_gates("llama")
    save_gate_adapter(with_lora(model, "llama", True), tmp_path)
    (tmp_path / "keep.txt").write_text("not ours")
    assert {p.name for p in tmp_path.iterdir()} == GATE_FILES | LORA_FILES | {"keep.txt"}
    save_gate_adapter(model, tmp_path)  # the transformers model inside the PEFT model: gates only
    assert {p.name for p in tmp_path.iterdir()} == GATE_FILES | {"keep.txt"}
    assert adapter_info(tmp_path)["lora"] is None


def test_load_from_a_base_folder_or_the_recorded_base(tmp_path):
    model, _ = trained_gates("llama")
    expected = logits(model, "llama")
    tiny_model("llama", seed=0).save_pretrained(tmp_path / "base")
    save_gate_adapter(model, tmp_path / "a", base_model_name_or_path=str(tmp_path / "base"))

    for base in (tmp_path / "base", None):  # given, and the one the adapter records
        loaded = load_gate_adapter(base, tmp_path / "a", attn_implementation="eager", dtype=torch.float32)
        assert torch.equal(logits(loaded, "llama"), expected)
        save_gate_adapter(loaded, tmp_path / "again")
        assert folder_files(tmp_path / "again") == folder_files(tmp_path / "a")

    save_gate_adapter(model, tmp_path / "no-base")  # a model built from a config has no name: base None
    assert adapter_info(tmp_path / "no-base")["base_model_name_or_path"] is None
    with pytest.raises(ValueError, match="records no base model; pass the base model"):
        load_gate_adapter(None, tmp_path / "no-base")
    with pytest.raises(ValueError, match=r"\['attn_implementation'\] only apply when a base id is given"):
        load_gate_adapter(tiny_model("llama"), tmp_path / "a", attn_implementation="eager")


def test_another_base_is_refused_naming_expected_and_found(tmp_path):
    model, _ = trained_gates("llama")
    save_gate_adapter(model, tmp_path, base_model_name_or_path="org/base")

    with pytest.raises(ValueError, match=r"expects num_hidden_layers 2 \(found 3\); its base is 'org/base'"):
        load_gate_adapter(tiny_model("llama", num_hidden_layers=3), tmp_path)
    with pytest.raises(ValueError, match=r"expects hidden_size 32 \(found 48\)"):
        load_gate_adapter(tiny_model("llama", hidden_size=48, head_dim=12), tmp_path)
    with pytest.raises(ValueError, match=r"num_key_value_heads 2 \(found 4\)"):
        load_gate_adapter(tiny_model("llama", num_key_value_heads=4), tmp_path)
    with pytest.raises(ValueError, match=r"class 'LlamaForCausalLM' \(found 'LlamaModel'\)"):
        load_gate_adapter(tiny_model("llama", bare=True), tmp_path)
    with pytest.raises(
        ValueError, match=r"class 'LlamaForCausalLM' \(found 'BertForSequenceClassification'\)"
    ):
        load_gate_adapter(tiny_model("bert"), tmp_path)

    patched = patch(tiny_model("llama"))
    with pytest.raises(
        ValueError, match=r"already patched with gated attention \(GateConfig\(variant='output'"
    ):
        load_gate_adapter(patched, tmp_path)
    wrapped = peft.get_peft_model(tiny_model("llama"), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    with pytest.raises(ValueError, match="PEFT-wrapped; pass the transformers model"):
        load_gate_adapter(wrapped, tmp_path)

    # same architecture under another name: loaded, with a warning (a local copy of the base is fine)
    other = tiny_model("llama")
    other.config._name_or_path = "org/other"
    with pytest.warns(
        UserWarning, match=r"saved on base 'org/base' \(revision None\); loading it on 'org/other'"
    ):
        loaded = load_gate_adapter(other, tmp_path)
    assert torch.equal(logits(loaded, "llama"), logits(model, "llama"))


def test_incomplete_or_foreign_folders(tmp_path):
    with pytest.raises(ValueError, match="not patched with gated attention"):
        save_gate_adapter(tiny_model("llama"), tmp_path / "x")
    assert not (tmp_path / "x").exists()

    model, _ = trained_gates("llama")
    save_gate_adapter(with_lora(model, "llama", False), tmp_path / "a")
    (tmp_path / "a" / adapters.LORA_WEIGHTS_NAME).unlink()
    with pytest.raises(ValueError, match=r"incomplete: missing \['adapter_model.safetensors'\], expected \["):
        load_gate_adapter(tiny_model("llama"), tmp_path / "a")
    (tmp_path / "a" / adapters.GATE_WEIGHTS_NAME).unlink()
    with pytest.raises(ValueError, match=r"missing \['gate_adapter_model.safetensors', 'adapter_model"):
        adapter_info(tmp_path / "a")
    (tmp_path / "a" / adapters.GATE_CONFIG_NAME).unlink()
    with pytest.raises(
        ValueError, match=r"not a gate adapter: expected gate_adapter_config.json, found \['adapter_config"
    ):
        load_gate_adapter(tiny_model("llama"), tmp_path / "a")

    save_gate_adapter(model, tmp_path / "b")
    config_file = tmp_path / "b" / adapters.GATE_CONFIG_NAME
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "format_version": 2}))
    with pytest.raises(ValueError, match=r"format 2; accepted: 'gate_attention' format <= 1"):
        adapter_info(tmp_path / "b")

    ia3 = peft.get_peft_model(model, peft.IA3Config(target_modules=["k_proj"], feedforward_modules=[]))
    with pytest.raises(ValueError, match="carry a LoRA only; the active PEFT adapter 'default' is IA3"):
        save_gate_adapter(ia3, tmp_path / "c")


def test_adapter_info(tmp_path):
    model, _ = trained_gates("llama")
    save_gate_adapter(with_lora(model, "llama", False), tmp_path, base_model_name_or_path="org/base")
    info = adapter_info(tmp_path)
    assert {k: info[k] for k in ("base_model_name_or_path", "revision", "base_model_class")} == {
        "base_model_name_or_path": "org/base",
        "revision": None,
        "base_model_class": "LlamaForCausalLM",
    }
    assert info["base_model"] == {
        "model_type": "llama",
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
    }
    assert info["gate_config"] == GateConfig(granularity="elementwise").to_dict()
    assert info["gate_tensors"] == {
        f"model.layers.{i}.self_attn.attn_gate.{name}": shape
        for i in (0, 1)
        for name, shape in (("bias", [32]), ("weight", [32, 32]))
    }
    assert info["gate_parameters"] == 2 * (32 * 32 + 32)
    assert info["lora"]["config"]["r"] == 2 and len(info["lora"]["tensors"]) == 8  # A, B x 2 targets x 2
    assert info["lora"]["parameters"] == 2 * 2 * (2 * 32 + 32 * 2)


def test_cli_info_on_an_adapter(tmp_path, capsys):
    from hf_gate_attention.cli import main

    model, _ = trained_gates("llama")
    save_gate_adapter(with_lora(model, "llama", False), tmp_path / "lora", base_model_name_or_path="org/base")
    save_gate_adapter(model, tmp_path / "gates", base_model_name_or_path="org/base", base_revision="v1")
    assert main(["info", str(tmp_path / "lora"), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {"kind": "gate adapter", **json.loads(json.dumps(adapter_info(tmp_path / "lora")))}
    assert main(["info", str(tmp_path / "gates")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{tmp_path / 'gates'}: gate adapter for org/base (revision v1)"
    assert "LlamaForCausalLM, model_type=llama, hidden_size=32, heads=4/2 (kv), layers=2" in lines[1]
    assert "granularity=elementwise" in lines[2] and "4 tensors, 2,112 parameters" in lines[2]
    assert lines[3] == "LoRA: none"


_DOWNLOAD = """
import sys, torch, hf_gate_attention
adapter, out = sys.argv[1:]
model = hf_gate_attention.load_gate_adapter(None, adapter, attn_implementation="eager").eval()
ids = torch.randint(3, 99, (2, 9), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    torch.save({"logits": model(ids).logits, "type": type(model).__name__}, out)
"""


@pytest.mark.slow
def test_push_to_the_hub_and_load_from_it(hub, tmp_path):  # noqa: F811 (the fixture)
    model, _ = trained_gates("llama")
    peft_model = with_lora(model, "llama", True)
    with pytest.raises(ValueError, match=r"base model is None, not a Hub id: pass base_model_name_or_path="):
        adapters.push_gate_adapter_to_hub(peft_model, "alice/adapter", token=TOKEN)
    save_gate_adapter(peft_model, tmp_path / "local-base", base_model_name_or_path=str(tmp_path / "base"))
    with pytest.raises(ValueError, match=r"not a Hub id"):
        adapters.push_gate_adapter_to_hub(tmp_path / "local-base", "alice/adapter", token=TOKEN)
    assert hub.requests == []

    base = tiny_model("llama", seed=0)
    base.save_pretrained(tmp_path / "base")
    upload(
        tmp_path / "base",
        "org/tiny-llama",
        token=TOKEN,
        private=False,
        revision=None,
        commit_message="base",
        commit_description=None,
        create_pr=False,
    )
    info = hf_gate_attention.push_gate_adapter_to_hub(
        peft_model, "alice/adapter", base_model_name_or_path="org/tiny-llama", token=TOKEN
    )
    uploaded = hub.files("alice/adapter")
    save_gate_adapter(peft_model, tmp_path / "local", base_model_name_or_path="org/tiny-llama")
    assert {k: v for k, v in uploaded.items() if k != "README.md"} == folder_files(tmp_path / "local")
    card = uploaded["README.md"].decode()
    assert card == adapters.render_adapter_card(tmp_path / "local", "alice/adapter")
    assert (
        "base_model: org/tiny-llama" in card
        and 'load_gate_adapter("org/tiny-llama", "alice/adapter")' in card
    )
    assert "2,112" in card  # the gate parameters: 2 x (32 x 32 + 32)
    assert info.oid == hub.head("alice/adapter")
    tagged = "alice/adapter-tagged"
    hf_gate_attention.push_gate_adapter_to_hub(
        tmp_path / "local", tagged, tags=["summarization"], token=TOKEN
    )
    tags = ModelCard(hub.files(tagged)["README.md"].decode()).data.tags
    assert tags[-1] == "summarization" and "gate-adapter" in tags

    out = tmp_path / "out.pt"
    subprocess.run(
        [sys.executable, "-c", _DOWNLOAD, "alice/adapter", str(out)],
        env=client_env(hub, tmp_path / "client-home"),
        cwd=REPO_ROOT,
        check=True,
    )
    result = torch.load(out)
    ids = torch.randint(3, 99, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(result["logits"], peft_model(ids).logits)
    assert result["type"] == "PeftModel"
    assert ("GET", f"/org/tiny-llama/resolve/{hub.head('org/tiny-llama')}/model.safetensors") in hub.requests

    # a folder is uploaded as it is, with the card
    hf_gate_attention.push_gate_adapter_to_hub(tmp_path / "local", "alice/folder", token=TOKEN)
    pushed = hub.files("alice/folder")
    assert pushed.pop("README.md").decode() == adapters.render_adapter_card(
        tmp_path / "local", "alice/folder"
    )
    assert pushed == folder_files(tmp_path / "local")


def test_import_stays_core_only():
    code = (
        "import sys, hf_gate_attention as h; assert 'hf_gate_attention.sharing.adapters' not in sys.modules; "
        "assert h.load_gate_adapter.__module__ == 'hf_gate_attention.sharing.adapters'; "
        "assert {'adapter_info', 'save_gate_adapter', 'push_gate_adapter_to_hub'} <= set(h.__all__)"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)
