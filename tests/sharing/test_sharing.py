"""Saved gated checkpoints load with transformers alone (trust_remote_code), with AutoGated* classes, and
through the `hf-gate-attention` command line."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from helpers import TINY_MODELS, first_output, make_tiny_model, tiny_inputs, tiny_model

import hf_gate_attention
from hf_gate_attention import GateConfig, gate_parameters, patch, unpatch
from hf_gate_attention.cli import main
from hf_gate_attention.offline import resolve_model
from hf_gate_attention.sharing.saving import ENTRY_MODULE, RUNTIME_MODULES, RUNTIME_PREFIX

# (model_type, gate): every variant, both granularities, top-k (dropped groups reading nothing, or their sink
# and window keys), a fused-qkv and an image model
CASES = {
    "llama-output-headwise-top1-kvgroup": (
        "llama",
        GateConfig(variant="output", init="paper", top_k=1, top_k_unit="kv_group"),
    ),
    "llama-output-top1-kvgroup-sink2-window3": (
        "llama",
        GateConfig(init="paper", top_k=1, top_k_unit="kv_group", top_k_sink=2, top_k_window=3),
    ),
    "phi3-value-elementwise": ("phi3", GateConfig(variant="value", granularity="elementwise", init="paper")),
    "bert-qk-headwise": ("bert", GateConfig(variant="qk", init="paper")),
    "vit-output-elementwise": ("vit", GateConfig(variant="output", granularity="elementwise", init="paper")),
    "dinov2-qk-elementwise-layer1": (
        "dinov2",
        GateConfig(variant="qk", granularity="elementwise", init="paper", layers=(1,)),
    ),
}

# Runs where `hf_gate_attention` cannot be imported: loads every case with trust_remote_code, compares with
# the outputs saved by the test, re-saves one with transformers alone and reloads it, then loads a gated
# checkpoint as a plain model (without trust_remote_code) and records transformers' warnings.
WITHOUT_PACKAGE = r"""
import json, logging, sys
sys.modules["hf_gate_attention"] = None  # `import hf_gate_attention` raises ImportError
import torch, transformers

root = sys.argv[1]
cases = json.load(open(f"{root}/cases.json"))
report = {}
for name, auto_name in cases.items():
    saved = torch.load(f"{root}/{name}.pt")
    auto = getattr(transformers, auto_name)
    model = auto.from_pretrained(f"{root}/{name}", trust_remote_code=True, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(**saved["inputs"])
    out = out.logits if hasattr(out, "logits") else out.last_hidden_state
    cls = type(model)
    diff = (out - saved["expected"]).abs().max().item()
    report[name] = {"class": cls.__module__.split(".")[-1] + "." + cls.__name__, "max_diff": diff}
    if name.startswith("llama"):
        model.save_pretrained(f"{root}/resaved")
        again = auto.from_pretrained(f"{root}/resaved", trust_remote_code=True, attn_implementation="eager")
        with torch.no_grad():
            logits = again.eval()(**saved["inputs"]).logits
        report["resaved"] = {"max_diff": (logits - saved["expected"]).abs().max().item()}

messages = []
handler = logging.Handler()
handler.emit = lambda record: messages.append(record.getMessage())
transformers.logging.get_logger().addHandler(handler)
transformers.logging.set_verbosity_warning()
try:  # without trust_remote_code (stdin is not a terminal: transformers does not ask)
    plain = transformers.AutoModelForCausalLM.from_pretrained(f"{root}/llama-output-headwise-top1-kvgroup")
    report["plain"] = {"class": type(plain).__name__, "warnings": "\n".join(messages)}
except ValueError as error:
    report["plain"] = {"error": str(error)}
messages.clear()
try:
    transformers.AutoModelForCausalLM.from_pretrained(f"{root}/mismatch", trust_remote_code=True)
    report["mismatch"] = {"error": None}
except RuntimeError as error:
    report["mismatch"] = {"error": str(error), "warnings": "\n".join(messages)}
json.dump(report, open(f"{root}/report.json", "w"))
"""


@pytest.fixture(scope="module")
def saved_cases(tmp_path_factory) -> Path:
    """Each case patched, saved, with its inputs and expected outputs; plus `cases.json` (name -> Auto)."""
    root = tmp_path_factory.mktemp("gated_checkpoints")
    cases = {}
    for name, (model_type, gate) in CASES.items():
        # the remote code runs top-k masked; the sparse path equals it within 1e-5 (tests/core/test_sparse.py)
        model = patch(tiny_model(model_type), gate, sparse=False)
        inputs = tiny_inputs(model_type)
        with torch.no_grad():
            expected = first_output(model(**inputs))
        model.save_pretrained(root / name)
        torch.save({"inputs": inputs, "expected": expected}, root / f"{name}.pt")
        cases[name] = TINY_MODELS[model_type][1].__name__
    (root / "cases.json").write_text(json.dumps(cases))
    # gate shapes that do not match the model: elementwise weights, config edited to headwise
    patch(tiny_model("llama"), GateConfig(granularity="elementwise")).save_pretrained(root / "mismatch")
    config = json.loads((root / "mismatch" / "config.json").read_text())
    config["gate_attention"]["granularity"] = "headwise"
    (root / "mismatch" / "config.json").write_text(json.dumps(config))
    return root


@pytest.fixture(scope="module")
def without_package(saved_cases) -> dict:
    env = {**os.environ, "HF_HOME": str(saved_cases / "hf_home"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PACKAGE, str(saved_cases)],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((saved_cases / "report.json").read_text())


def test_saved_folder_holds_weights_code_and_auto_map(saved_cases):
    folder = saved_cases / "bert-qk-headwise"
    files = {path.name for path in folder.iterdir()}
    assert {"config.json", "model.safetensors", f"{ENTRY_MODULE}.py"} <= files
    assert {f"{RUNTIME_PREFIX}{module}.py" for module in RUNTIME_MODULES} <= files
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "gated_bert"
    assert config["architectures"] == ["GatedBertForSequenceClassification"]
    assert config["auto_map"]["AutoConfig"] == f"{ENTRY_MODULE}.GatedBertConfig"
    assert config["auto_map"]["AutoModel"] == f"{ENTRY_MODULE}.GatedBertModel"
    assert config["auto_map"]["AutoModelForSequenceClassification"] == (
        f"{ENTRY_MODULE}.GatedBertForSequenceClassification"
    )
    assert config["gate_attention"]["variant"] == "qk"


@pytest.mark.parametrize("name", sorted(CASES))
def test_trust_remote_code_without_the_package_gives_identical_outputs(without_package, name):
    model_type = CASES[name][0]
    auto = TINY_MODELS[model_type][1]
    base_class = auto._model_mapping[transformers.AutoConfig.for_model(model_type).__class__]
    expected_class = f"{ENTRY_MODULE}.Gated{base_class.__name__}"
    assert without_package[name]["class"] == expected_class
    assert without_package[name]["max_diff"] == 0.0


def test_resaving_with_transformers_alone_keeps_the_gate_code(without_package):
    assert without_package["resaved"]["max_diff"] == 0.0


def test_plain_load_without_the_gate_code_refuses(without_package):
    """`config.json` names the model type `gated_llama`: an Auto class without `trust_remote_code` refuses it
    instead of loading transformers' Llama without the gates."""
    assert "class" not in without_package["plain"]
    assert "Please pass the argument `trust_remote_code=True`" in without_package["plain"]["error"]


def test_trust_remote_code_refuses_gate_shapes_that_do_not_match(without_package):
    assert "ignore_mismatched_sizes" in without_package["mismatch"]["error"]
    report = without_package["mismatch"]["warnings"]
    assert "attn_gate.weight" in report and "torch.Size([32, 32]) vs model:torch.Size([4, 32])" in report


@pytest.mark.parametrize("name", ["bert-qk-headwise", "vit-output-elementwise"])
def test_auto_gated_classes_rebuild_the_task_head(saved_cases, name):
    model_type = CASES[name][0]
    auto_gated = getattr(
        hf_gate_attention, TINY_MODELS[model_type][1].__name__.replace("Model", "GatedModel", 1)
    )
    model = auto_gated.from_pretrained(str(saved_cases / name), attn_implementation="eager").eval()
    saved = torch.load(saved_cases / f"{name}.pt")
    with torch.no_grad():
        assert torch.equal(first_output(model(**saved["inputs"])), saved["expected"])


def test_gates_of_a_remote_code_model_are_its_gate_parameters(saved_cases):
    """`gate_parameters` / `freeze_all_but_gates` find the gates of a `trust_remote_code` load, whose class is
    the checkpoint's copy of `AttentionGate` (they froze every parameter before)."""
    folder = str(saved_cases / "llama-output-headwise-top1-kvgroup")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    gates = {name for name, _ in model.named_parameters() if ".attn_gate." in name}
    assert type(model.model.layers[0].self_attn.attn_gate) is not hf_gate_attention.AttentionGate
    hf_gate_attention.freeze_all_but_gates(model)
    assert {name for name, p in model.named_parameters() if p.requires_grad} == gates
    assert len(gates) == 2 * model.config.num_hidden_layers


def test_unpatch_restores_plain_saving(tmp_path):
    model = patch(tiny_model("llama"), GateConfig())
    assert "save_pretrained" in vars(model) and "push_to_hub" in vars(model)
    unpatch(model)
    assert "save_pretrained" not in vars(model) and "push_to_hub" not in vars(model)
    model.save_pretrained(tmp_path)
    assert not (tmp_path / f"{ENTRY_MODULE}.py").exists()
    assert "auto_map" not in json.loads((tmp_path / "config.json").read_text())


def test_model_of_a_custom_class_saves_without_remote_code(tmp_path, caplog):
    class MyLlama(transformers.LlamaForCausalLM):
        pass

    model = patch(MyLlama(tiny_model("llama").config), GateConfig())
    model.save_pretrained(tmp_path)
    assert not (tmp_path / f"{ENTRY_MODULE}.py").exists()
    assert "MyLlama is not a transformers class" in caplog.text
    with pytest.raises(
        ValueError, match="'MyLlama', which is not a transformers model class; pass model_class="
    ):
        hf_gate_attention.from_pretrained(str(tmp_path))
    loaded = hf_gate_attention.from_pretrained(str(tmp_path), model_class=transformers.AutoModelForCausalLM)
    assert hf_gate_attention.is_patched(loaded)


# ---- command line -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("cli") / "llama")


def test_cli_patch_info_card(tiny_llama, tmp_path, capsys):
    out = tmp_path / "gated"
    argv = ["patch", str(tiny_llama), str(out), "--variant", "qk", "--init", "paper", "--layers", "1"]
    assert main(argv) == 0
    files = {path.name for path in out.iterdir()}
    assert {"tokenizer.json", "model.safetensors", f"{ENTRY_MODULE}.py"} <= files
    model = hf_gate_attention.from_pretrained(str(out))
    assert hf_gate_attention.gate_config_of(model) == GateConfig(variant="qk", init="paper", layers=(1,))
    added = sum(p.numel() for p in gate_parameters(model))
    assert f"Added parameters: {added:,}" in capsys.readouterr().out

    assert main(["info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["added_params"] == added and info["gated_layers"] == 1
    assert info["trust_remote_code"] and not info["gates_are_identity"]
    (layer,) = info["layers"].values()
    bias = next(p for n, p in model.named_parameters() if n.endswith("attn_gate.bias"))
    assert layer["gate_at_zero_mean"] == pytest.approx(torch.sigmoid(bias.float()).mean().item(), rel=1e-6)
    assert main(["info", str(out)]) == 0
    assert "added parameters" in capsys.readouterr().out

    assert main(["card", str(out), "--repo-id", "me/tiny-gated"]) == 0
    card = (out / "README.md").read_text()
    assert "gated-attention" in card and "me/tiny-gated" in card


def test_cli_patch_has_an_option_for_every_gate_config_field(tiny_llama, tmp_path, capsys):
    """The options are generated from GateConfig's fields: a new field is on the command line at once."""
    with pytest.raises(SystemExit):
        main(["patch", "--help"])
    text = capsys.readouterr().out
    for field in dataclasses.fields(GateConfig):
        assert f"--{field.name.replace('_', '-')}" in text and field.metadata["help"][:20] in text
    out = tmp_path / "sparse"
    argv = ["patch", str(tiny_llama), str(out), "--top-k", "1", "--top-k-unit", "kv_group", "--init", "paper"]
    assert main([*argv, "--top-k-sink", "2", "--top-k-window", "8", "--layers", "0,1"]) == 0
    model = hf_gate_attention.from_pretrained(str(out))
    expected = GateConfig(
        top_k=1, top_k_unit="kv_group", init="paper", top_k_sink=2, top_k_window=8, layers=(0, 1)
    )
    assert hf_gate_attention.gate_config_of(model) == expected
    with pytest.raises(SystemExit) as exit_info:
        main(["patch", str(tiny_llama), str(tmp_path / "x"), "--top-k-unit", "group"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'group' (choose from 'head', 'kv_group')" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--cb-max-memory-percent", "1.5", "expected a fraction in (0, 1]; got '1.5'"),
        ("--cb-max-memory-percent", "0", "expected a fraction in (0, 1]; got '0'"),
        ("--cb-num-blocks", "0", "expected an integer >= 1; got '0'"),
    ],
)
def test_cli_serve_refuses_cache_sizes_it_cannot_take(tiny_llama, capsys, option, value, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", str(tiny_llama), option, value])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["patch", "/nonexistent/model", "{tmp}/out"], "/nonexistent/model"),
        (
            ["patch", "{model}", "{tmp}/busy"],
            "exists and is not an empty folder; pass overwrite=True (--overwrite)",
        ),
        (["info", "{model}"], "not a gated checkpoint"),
        (["card", "{tmp}/busy"], "not a gated checkpoint"),
        (["push", "{tmp}/busy", "me/x"], "has no config.json"),
        (["info", "{tmp}/nope"], "'{tmp}/nope': no such file or folder"),
        (["info", "{tmp}/busy/file"], "is a file; expected a checkpoint folder or a Hub id"),
        (["info", "{tmp}/busy"], "busy is not a gated checkpoint: it has no config.json (found: file)"),
        (["convert", "{tmp}/nope", "{tmp}/out"], "source '{tmp}/nope': no such file or folder"),
        (["patch", "{model}", "{tmp}/busy/file/sub"], "cannot write the folder {tmp}/busy/file/sub: "),
        (
            ["patch", "{model}", "{tmp}/x", "--model-class", "logging"],
            "'logging', which is not a transformers",
        ),
        (["card", "{model}", "--run", "gated"], "names a run of a recipe's results folder: pass results="),
        (
            ["diagnose", "{model}", "--text-file", "{tmp}/busy/file", "--out", "{tmp}/busy/file"],
            "--out {tmp}/busy/file: {tmp}/busy/file is a file; name a folder",
        ),
        (
            ["diagnose", "{model}", "--images", "{tmp}/busy/file", "--out", "{tmp}/d"],
            "--images: {tmp}/busy/file is not an image file PIL can read",
        ),
    ],
)
def test_cli_bad_input_exits_with_one_line(tiny_llama, tmp_path, capsys, argv, message):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("x")
    argv = [arg.format(tmp=tmp_path, model=tiny_llama) for arg in argv]
    message = message.format(tmp=tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hf-gate-attention: error:") and "\n" not in err and message in err


def test_cli_push_without_token_fails_before_uploading(tiny_llama, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "")
    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    monkeypatch.setattr("hf_gate_attention.sharing.hub.get_token", lambda: None)
    assert main(["patch", str(tiny_llama), str(tmp_path / "gated")]) == 0
    assert main(["push", str(tmp_path / "gated"), "me/x"]) == 2
    assert "no Hugging Face token" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["patch", "card", "push", "info"])
def test_cli_help_lists_every_option(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    expected = {"patch": "--granularity", "card": "--results", "push": "--private", "info": "--json"}
    assert expected[command] in text


@pytest.mark.parametrize("command", [["summarize"], ["recipe", "summarization"]])
def test_cli_summarize_is_the_recipe_command(command, capsys):
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    text = capsys.readouterr().out
    assert "max_steps (default: -1)" in text and "reproduction" in text


def test_loading_says_what_it_did_not_load(tmp_path, caplog):
    """The package's load reports what transformers' report would (only the gate keys are left out): base
    weights missing from the checkpoint, a task head that does not fit, and a gate config without what
    gives the saved gates their meaning is refused."""
    import safetensors.torch

    folder = tmp_path / "gated"
    patch(tiny_model("llama"), init="paper").save_pretrained(folder)
    with caplog.at_level("WARNING", logger="hf_gate_attention.sharing.loading"):
        hf_gate_attention.from_pretrained(str(folder))
    assert not caplog.records  # a complete checkpoint: nothing to say (the gate keys are not reported)
    with caplog.at_level("WARNING", logger="hf_gate_attention.sharing.loading"):
        hf_gate_attention.from_pretrained(str(folder), transformers.AutoModelForSequenceClassification)
    assert "not in the checkpoint, newly initialised: score.weight" in caplog.text
    weights = safetensors.torch.load_file(folder / "model.safetensors")
    del weights["model.layers.0.mlp.up_proj.weight"]
    safetensors.torch.save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    caplog.clear()
    with caplog.at_level("WARNING", logger="hf_gate_attention.sharing.loading"):
        hf_gate_attention.from_pretrained(str(folder))
    assert "model.layers.0.mlp.up_proj.weight" in caplog.text
    config = json.loads((folder / "config.json").read_text())
    config["gate_attention"] = {}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="lacks variant, granularity, init"):
        hf_gate_attention.from_pretrained(str(folder))


def test_info_on_a_checkpoint_without_its_gate_weights_fails(tmp_path, capsys):
    import safetensors.torch

    folder = tmp_path / "gated"
    patch(tiny_model("llama")).save_pretrained(folder)
    weights = safetensors.torch.load_file(folder / "model.safetensors")
    kept = {k: v for k, v in weights.items() if ".attn_gate." not in k}
    safetensors.torch.save_file(kept, folder / "model.safetensors", metadata={"format": "pt"})
    assert main(["info", str(folder)]) == 2
    assert "its weights hold none: the checkpoint is incomplete" in capsys.readouterr().err


def test_info_lists_layers_in_numeric_order(tmp_path):
    from hf_gate_attention.sharing.statistics import checkpoint_statistics

    folder = tmp_path / "gated"
    patch(tiny_model("llama", num_hidden_layers=12)).save_pretrained(folder)
    layers = list(checkpoint_statistics(folder)["layers"])
    assert layers == [f"model.layers.{i}.self_attn" for i in range(12)]


def test_gated_names_in_config_json_and_base_names_in_memory(tmp_path):
    """`config.json` names `gated_llama` / `GatedLlamaForCausalLM`; a loaded model's config keeps the base
    model type (PEFT's default LoRA targets, transformers' weight conversions look it up), through the package
    and through the remote code, and `pipeline(..., trust_remote_code=True)` builds the gated class."""
    peft = pytest.importorskip("peft")
    model = patch(tiny_model("llama"), GateConfig(init="paper"))
    model.save_pretrained(tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (saved["model_type"], saved["architectures"]) == ("gated_llama", ["GatedLlamaForCausalLM"])
    remote = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m", trust_remote_code=True)
    for loaded in (hf_gate_attention.from_pretrained(tmp_path / "m"), remote):
        assert loaded.config.model_type == "llama"
        lora = peft.get_peft_model(loaded, peft.LoraConfig(r=2))  # default targets: llama's q_proj, v_proj
        assert any("q_proj.lora_A" in name for name, _ in lora.named_parameters())
    tokenizer = resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")  # the tiny model has none
    generator = transformers.pipeline(
        "text-generation", model=str(tmp_path / "m"), tokenizer=tokenizer, trust_remote_code=True
    )
    assert type(generator.model).__name__ == "GatedLlamaForCausalLM"


def test_a_checkpoint_written_before_gated_model_types_still_loads(tmp_path):
    """Checkpoints of earlier versions name the base model type and transformers' classes."""
    model = patch(tiny_model("llama"), GateConfig(init="paper"))
    for param in gate_parameters(model):
        torch.nn.init.normal_(param, std=0.5)
    model.save_pretrained(tmp_path / "m")
    config_path = tmp_path / "m" / "config.json"
    config = json.loads(config_path.read_text())
    config.update(model_type="llama", architectures=["LlamaForCausalLM"])
    del config["auto_map"]
    config_path.write_text(json.dumps(config))
    inputs = tiny_inputs("llama")
    loaded = hf_gate_attention.from_pretrained(tmp_path / "m")
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs).logits, model(**inputs).logits, rtol=0, atol=1e-6)


def test_processors_of_a_gated_checkpoint_load_without_a_remote_code_question(tmp_path, monkeypatch):
    """transformers' Auto processor classes read `config.json`, whose `gated_llama` they do not know: alone
    they ask whether to run the checkpoint's code (`input`); `load_processor` (the package's command line,
    recipes and server) loads the tokenizer without asking, the same tokenizer the base model has."""
    from hf_gate_attention.sharing.loading import load_processor

    base = resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    patch(tiny_model("llama"), GateConfig(init="paper")).save_pretrained(tmp_path / "m")
    transformers.AutoTokenizer.from_pretrained(base).save_pretrained(tmp_path / "m")
    questions = []
    monkeypatch.setattr("builtins.input", lambda *args: questions.append(args) or "n")
    transformers.AutoTokenizer.from_pretrained(tmp_path / "m")
    assert len(questions) == 1, "transformers alone is expected to ask (else load_processor is not needed)"
    text = "Gated attention, 2025."
    expected = transformers.AutoTokenizer.from_pretrained(base)(text)["input_ids"]
    for auto_class in (transformers.AutoTokenizer, transformers.AutoProcessor):
        questions.clear()
        assert load_processor(str(tmp_path / "m"), auto_class)(text)["input_ids"] == expected
        assert not questions, f"{auto_class.__name__} asked about remote code"


def test_api_bad_inputs_say_what_was_wrong(tmp_path, caplog):
    """patch of a non-model, a bad block pattern, a model class named by a string (accepted) or a name that
    is none, a missing local checkpoint, NaN gate weights (a warning naming them)."""
    with pytest.raises(TypeError, match=r"patch takes a transformers model .*; got Linear"):
        patch(torch.nn.Linear(4, 4))
    with pytest.raises(TypeError, match="got NoneType"):
        patch(None)
    with pytest.raises(ValueError, match=r"is not a regular expression: missing \)"):
        hf_gate_attention.AttentionFamily(query="q", key="k", value="v", output="o", block=r"layers\.(\d+")
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        hf_gate_attention.from_pretrained(str(tmp_path / "does-not-exist"))
    model = patch(tiny_model("llama"), GateConfig(init="paper"))
    model.save_pretrained(tmp_path / "m")
    assert type(
        hf_gate_attention.from_pretrained(tmp_path / "m", model_class="LlamaForCausalLM")
    ).__name__ == ("LlamaForCausalLM")
    with pytest.raises(
        ValueError,
        match=r"model_class= 'logging', which is not a transformers model class; use e\.g\. AutoModel",
    ):
        hf_gate_attention.from_pretrained(tmp_path / "m", model_class="logging")
    for param in gate_parameters(model):
        param.data.fill_(float("nan"))
    model.save_pretrained(tmp_path / "nan")
    with caplog.at_level("WARNING", logger="hf_gate_attention.sharing.loading"):
        hf_gate_attention.from_pretrained(tmp_path / "nan")
    assert "gate tensor(s) hold NaN or inf" in caplog.text and ".attn_gate.weight" in caplog.text
    from hf_gate_attention.sharing.statistics import checkpoint_statistics

    assert (
        len(checkpoint_statistics(tmp_path / "nan")["non_finite"])
        == 2 * len(list(gate_parameters(model))) // 2
    )
