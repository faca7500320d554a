"""`diagnose`: attention sink, massive activations and gate statistics, checked against hand-built models
with known answers and against eager attention's own weights; outputs unchanged; the callback; the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers
from helpers import IMAGE_MODELS, TINY_MODELS, first_output, make_tiny_model, tiny_inputs, tiny_model
from model_zoo import zoo_model
from supported_models import model_of_unknown_layout

from hf_gate_attention import GateConfig, patch
from hf_gate_attention.cli import main as cli_main
from hf_gate_attention.diagnostics import DiagnosticsCallback, attention_probabilities, diagnose, text_inputs
from hf_gate_attention.diagnostics.measure import _PROBED


def _one(inputs: dict, index: int = 0) -> dict:
    return {name: value[index : index + 1] for name, value in inputs.items()}


def _sink_bert(score: float, length: int):
    """A 1-layer, 1-head BERT whose every query gives key 0 the logit `score` and every other key 0.

    Token 5 sits at position 0, token 6 everywhere else; position and type embeddings are zero, so the
    embedding LayerNorm maps them to orthogonal vectors; the key reads the first one only."""
    config = transformers.BertConfig(
        vocab_size=10, hidden_size=4, num_hidden_layers=1, num_attention_heads=1, intermediate_size=4,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=length,
    )  # fmt: skip
    model = transformers.BertModel(config, add_pooling_layer=False).eval()
    with torch.no_grad():
        embeddings = model.embeddings
        embeddings.position_embeddings.weight.zero_()
        embeddings.token_type_embeddings.weight.zero_()
        embeddings.word_embeddings.weight[5] = torch.tensor(
            [1.0, -1.0, 0.0, 0.0]
        )  # LayerNorm: [√2, -√2, 0, 0]
        embeddings.word_embeddings.weight[6] = torch.tensor([0.0, 0.0, 1.0, -1.0])
        attention = model.encoder.layer[0].attention.self
        attention.key.weight.zero_()
        attention.key.bias.zero_()
        attention.key.weight[0, 0] = 1 / math.sqrt(2)  # k_0 = [1, 0, 0, 0] at token 5, 0 at token 6
        attention.query.weight.zero_()
        attention.query.bias.copy_(torch.tensor([2.0 * score, 0.0, 0.0, 0.0]))  # x scaling 1/2: logit = score
    ids = torch.tensor([[5] + [6] * (length - 1)])
    return model, {"input_ids": ids}


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_first_token_attention_of_a_hand_built_model_is_the_softmax_share(implementation):
    model, inputs = _sink_bert(score=2.0, length=10)
    model.set_attn_implementation(implementation)
    result = diagnose(model, [inputs], skip_queries=2)
    expected = math.exp(2.0) / (math.exp(2.0) + 9)  # 0.4508 on key 0 for every query
    assert result["attention"]["first_token"] == [[pytest.approx(expected, abs=1e-5)]]
    assert result["attention"]["top1"] == [[pytest.approx(expected, abs=1e-5)]]
    assert result["attention"]["queries"] == 8
    assert result["attention"]["top1_at_first"] == [[1.0]]  # key 0 holds the largest weight of every query
    assert result["attention"]["top1_at_previous"] == [[0.0]] and result["attention"]["top1_at_self"] == [
        [0.0]
    ]
    assert result["summary"]["first_token_attention"] == pytest.approx(expected, abs=1e-5)


def test_causal_uniform_attention_gives_the_harmonic_mean():
    model = tiny_model("llama", bare=True, attn_implementation="sdpa")
    with torch.no_grad():
        for layer in model.layers:
            layer.self_attn.q_proj.weight.zero_()  # q = 0: every causal row is uniform
    length, skip = 12, 3
    result = diagnose(model, [tiny_inputs("llama", batch=1, length=length)], skip_queries=skip)
    expected = sum(1 / (i + 1) for i in range(skip, length)) / (length - skip)
    for layer in result["attention"]["first_token"]:
        assert layer == pytest.approx([expected] * 4, abs=1e-6)


@pytest.mark.parametrize("model_type", sorted(TINY_MODELS))
def test_probe_weights_equal_eager_attention_weights(model_type):
    model = tiny_model(model_type, attn_implementation="eager")
    inputs = _one(tiny_inputs(model_type, batch=1))
    eager = model(**inputs, output_attentions=True).attentions
    skip = 2
    expected_first = [a[0, :, skip:, 0].mean(-1) for a in eager]
    expected_top1 = [a[0, :, skip:].amax(-1).mean(-1) for a in eager]
    if model_type != "gemma2":  # gemma2 has no SDPA in transformers: its probe reads the eager weights
        model.set_attn_implementation("sdpa")
    result = diagnose(model, [inputs], skip_queries=skip)
    for layer, (first, top1) in enumerate(zip(expected_first, expected_top1, strict=True)):
        torch.testing.assert_close(
            torch.tensor(result["attention"]["first_token"][layer]), first, atol=1e-5, rtol=0
        )
        torch.testing.assert_close(torch.tensor(result["attention"]["top1"][layer]), top1, atol=1e-5, rtol=0)


def test_attention_probabilities_read_every_mask_format():
    torch.manual_seed(0)
    query, key = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
    padding = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    boolean = (causal & padding[:, None, None, :].bool()).expand(2, 1, 5, 5)
    additive = torch.zeros(2, 1, 5, 5).masked_fill(~boolean, torch.finfo(torch.float32).min)
    reference = attention_probabilities(query, key, boolean)
    torch.testing.assert_close(attention_probabilities(query, key, padding, is_causal=True), reference)
    # a fully masked row is 0 with -inf masks, uniform with additive ones; the other rows agree
    torch.testing.assert_close(attention_probabilities(query, key, additive)[:, :, 1:], reference[:, :, 1:])
    assert reference[1, :, 0].abs().max() == 0
    assert reference[1, :, :, 0].abs().max() == 0  # the padded key gets nothing
    assert torch.allclose(reference.sum(-1)[:, :, 1:], torch.ones(2, 4, 4))


@pytest.mark.parametrize(
    ("gate", "implementation", "backend"),
    [
        (None, "sdpa", None),
        (None, "eager", None),
        (GateConfig(top_k=1, top_k_unit="kv_group", init="paper"), "sdpa", "torch"),
        (GateConfig(variant="qk", init="paper"), "sdpa", "triton"),
    ],
    ids=["ungated-sdpa", "ungated-eager", "sparse-top1", "triton-fused"],
)
def test_the_model_computes_the_same_during_and_after_a_probe(gate, implementation, backend):
    if backend == "triton":
        pytest.importorskip("triton")
    model = tiny_model("llama", attn_implementation=implementation)
    if gate is not None:
        patch(model, gate, backend=backend)
    implementation_before = model.config._attn_implementation
    inputs = _one(tiny_inputs("llama", batch=1))
    with torch.no_grad():  # as the probe runs (the triton backend routes short gradient-free queries apart)
        reference = model(**inputs).logits
    seen = []
    handle = model.register_forward_hook(lambda module, args, output: seen.append(output.logits))
    diagnose(model, [inputs])
    handle.remove()
    assert torch.equal(seen[0], reference)
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, reference)
    assert model.config._attn_implementation == implementation_before
    assert len(_PROBED) == 0


def test_massive_activation_position_and_channel_are_found():
    model = tiny_model("llama", bare=True, attn_implementation="sdpa")
    ids = tiny_inputs("llama", batch=1, length=9)["input_ids"]
    ids[0, 6] = 2  # tiny_inputs draws ids >= 3: token 2 appears only here
    with torch.no_grad():
        model.embed_tokens.weight[2, 13] = 1000.0  # carried by the residual stream through every layer
    result = diagnose(model, [{"input_ids": ids[:, :5]}, {"input_ids": ids}])
    activations = result["activations"]
    assert activations["position"] == [6, 6] and activations["channel"] == [13, 13]
    assert activations["input"] == [1, 1]
    assert min(activations["max_abs"]) > 900 and max(activations["median_abs"]) < 10
    assert result["summary"]["max_activation"] == max(activations["max_abs"])


def test_gate_statistics_of_constant_gates_and_top_k_keep_rates():
    model = tiny_model("llama", attn_implementation="sdpa")  # 4 heads, 2 key/value groups
    patch(model, GateConfig(init="paper", top_k=1, top_k_unit="kv_group"))
    bias = torch.tensor([-3.0, -2.5, 1.0, 2.0])  # sigmoid: 0.047, 0.076, 0.731, 0.881
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.attn_gate.weight.zero_()
            layer.self_attn.attn_gate.bias.copy_(bias)
    result = diagnose(model, [_one(tiny_inputs("llama", batch=1))])
    gates = result["gates"]
    expected = torch.sigmoid(bias)
    assert gates["layers"] == [0, 1]
    for layer in range(2):
        torch.testing.assert_close(
            torch.tensor(gates["mean"][layer], dtype=torch.float64), expected.double(), atol=1e-6, rtol=0
        )
        assert gates["below_0.1"][layer] == [1.0, 1.0, 0.0, 0.0]
        assert gates["keep_rate"][layer] == [0.0, 0.0, 1.0, 1.0]  # group 1 (heads 2, 3) has the larger mean
        for q in ("0.05", "0.5", "0.95"):  # histogram resolution 1/200
            assert gates["quantiles"][q][layer] == pytest.approx(expected.tolist(), abs=0.005 + 1e-9)
    assert result["summary"]["gate_below_0.1"] == 0.5


@pytest.mark.parametrize("variant", ["value", "qk"])
def test_gate_statistics_follow_the_gate_inputs_of_every_variant(variant):
    model = tiny_model("phi3" if variant == "qk" else "llama", attn_implementation="sdpa")  # phi3: fused qkv
    patch(model, GateConfig(variant=variant, granularity="elementwise", init="paper"))
    inputs = _one(tiny_inputs("llama", batch=1))
    captured = {}
    block = model.model.layers[0].self_attn
    gate = block.attn_gate
    if variant == "value":
        handle = block.v_proj.register_forward_hook(lambda m, a, o: captured.update(x=a[0]))
    else:
        q_size = 4 * 8
        handle = block.qkv_proj.register_forward_hook(
            lambda m, a, o: captured.update(q=o[..., :q_size], k=o[..., q_size : q_size + 16])
        )
    with torch.no_grad():
        model(**inputs)
    handle.remove()
    expected = gate(**captured)[0].transpose(0, 1).flatten(1).double().mean(-1)  # (G,)
    result = diagnose(model, [inputs])
    torch.testing.assert_close(
        torch.tensor(result["gates"]["mean"][0], dtype=torch.float64), expected, atol=1e-6, rtol=0
    )
    assert result["gates"]["keep_rate"] is None


@pytest.mark.parametrize("model_type", (*IMAGE_MODELS, "bert"))
def test_encoders_and_vision_models_are_diagnosed_patched(model_type):
    model = tiny_model(model_type, attn_implementation="sdpa")
    patch(model, GateConfig(variant="qk", init="paper"))
    result = diagnose(model, [_one(tiny_inputs(model_type, batch=1))], skip_queries=1)
    assert len(result["attention"]["first_token"]) == 2
    assert len(result["gates"]["mean"][0]) == 4
    assert all(0 < value < 1 for row in result["attention"]["first_token"] for value in row)


def test_bad_inputs_and_models_get_clear_errors():
    model = tiny_model("llama", attn_implementation="sdpa")
    with pytest.raises(ValueError, match="at least one input"):
        diagnose(model, [])
    padded = {
        "input_ids": torch.tensor([[3, 4, 5, 6, 7, 8]]),
        "attention_mask": torch.tensor([[0, 1, 1, 1, 1, 1]]),
    }
    with pytest.raises(ValueError, match="padding"):
        diagnose(model, [padded])
    with pytest.raises(ValueError, match="batch size 2"):
        diagnose(model, [tiny_inputs("llama", batch=2)])
    paged = tiny_model("llama", attn_implementation="sdpa")
    paged.config._attn_implementation = "paged|eager"
    with pytest.raises(
        ValueError, match=r"cannot probe attention implementation 'paged\|eager'; probed: eager"
    ):
        diagnose(paged, [_one(tiny_inputs("llama", batch=1))])
    with pytest.raises(ValueError, match=r"model type 'llama' .*found no attention block"):
        diagnose(model_of_unknown_layout(), [{"input_ids": torch.tensor([[3, 4, 5, 6, 7, 8]])}])
    with pytest.raises(ValueError, match=r"several stacks of self-attention blocks.*part='decoder'"):
        diagnose(zoo_model("bart"), [{"input_ids": torch.tensor([[3, 4, 5, 6, 7, 8]])}])
    with pytest.raises(
        ValueError, match=r"part='vision' selects 0 stacks .* The model's stacks: model.decoder"
    ):
        diagnose(zoo_model("bart"), [{"input_ids": torch.tensor([[3, 4, 5, 6, 7, 8]])}], part="vision")


@pytest.mark.parametrize("model_type", ["bart", "vision-encoder-decoder"])
def test_cross_attention_gates_are_reported_apart_from_the_decoders_own(model_type):
    """With `part="decoder"`, an encoder-decoder's decoder is diagnosed and the gates of its cross-attention
    (`AttentionBlock.kind == "cross"`) are listed apart, by layer, with their own summary and table
    columns."""
    from hf_gate_attention.core.families import find_attention
    from hf_gate_attention.diagnostics.report import summary_table

    model = zoo_model(model_type)
    patch(model, GateConfig(attention=("cross", "decoder"), init="paper", parts=("decoder",)))
    cross = [b for b in find_attention(model) if b.kind == "cross"]
    heads = cross[0].geometry["num_heads"]
    bias = torch.linspace(-3.0, 2.0, heads)
    with torch.no_grad():
        for block in find_attention(model):
            gate = block.module.attn_gate if hasattr(block.module, "attn_gate") else None
            if gate is not None:
                gate.weight.zero_()
                gate.bias.copy_(bias if block.kind == "cross" else torch.zeros(heads))
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
    if model_type == "bart":
        inputs = {"input_ids": ids}
    else:
        size = model.config.encoder.image_size
        inputs = {"pixel_values": torch.randn(1, 3, size, size), "decoder_input_ids": ids}
    result = diagnose(model, [inputs], skip_queries=1, part="decoder")
    assert result["cross_gates"]["layers"] == [b.index for b in cross] == [0, 1]
    for layer in range(2):
        torch.testing.assert_close(
            torch.tensor(result["cross_gates"]["mean"][layer]), torch.sigmoid(bias), atol=1e-6, rtol=0
        )
        assert result["gates"]["mean"][layer] == pytest.approx([0.5] * heads)  # the decoder's self-attention
    summary = result["summary"]
    assert summary["cross_gate_mean"] == pytest.approx(torch.sigmoid(bias).mean().item())
    assert summary["cross_gate_below_0.1"] == pytest.approx(1 / heads)  # sigmoid(-3) = 0.047
    assert result["model"]["part"] == "decoder"
    own = {key: value for key, value in summary.items() if not key.startswith("cross")}
    table = summary_table({"with": summary, "without": own})
    assert "cross gate mean" in table and f"{summary['cross_gate_mean']:.3f}" in table
    assert table.splitlines()[-1].endswith("| - | - |")


def test_a_layer_whose_attention_bypasses_the_attention_interface_is_named():
    model = tiny_model("llama", attn_implementation="sdpa")
    attention = model.model.layers[1].self_attn

    def own_attention(hidden_states, **kwargs):  # computes something without transformers' interface
        return attention.o_proj(attention.v_proj(hidden_states).repeat(1, 1, 2)), None

    attention.forward = own_attention
    with pytest.raises(ValueError, match=r"no attention weights were recorded for layers \[1\]"):
        diagnose(model, [_one(tiny_inputs("llama", batch=1))])
    assert model.config._attn_implementation == "sdpa" and len(_PROBED) == 0


def test_text_inputs_truncate_and_skip_short_texts(tmp_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(make_tiny_model(tmp_path / "m"))
    items = text_inputs(tokenizer, ["w1 w2 w3 w4 w5 w6 w7 w8 w9 w10", "w1 w2", "w3 " * 40], max_length=16)
    assert [item["input_ids"].shape for item in items] == [torch.Size([1, 10]), torch.Size([1, 16])]


REPORTED: list[dict] = []  # what the spy callback received


class _LogSpy(transformers.TrainerCallback):
    """What a reporting integration receives in `on_log`."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        REPORTED.append(dict(logs))


def _train(tmp_path, callback_factory, max_steps=4, resume=False):
    model_dir = tmp_path / "model"
    if not model_dir.exists():
        make_tiny_model(model_dir)
    model = patch(transformers.AutoModelForCausalLM.from_pretrained(model_dir), init="paper")
    data = [{"input_ids": torch.randint(4, 20, (12,))} for _ in range(8)]
    data = [{**row, "labels": row["input_ids"]} for row in data]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "checkpoints"), max_steps=max_steps, per_device_train_batch_size=2,
        logging_steps=2, save_steps=2, report_to="none", use_cpu=True, learning_rate=1e-2,
    )  # fmt: skip
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    callback = callback_factory(data).attach(trainer)
    assert trainer.callback_handler.callbacks[0] is callback
    trainer.add_callback(_LogSpy())  # runs after the attached callback, like TensorBoard/W&B integrations
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoints" / "checkpoint-2") if resume else None)
    return trainer, callback


def test_callback_logs_gate_statistics_into_the_trainer_logs_and_a_file(tmp_path):
    out = tmp_path / "diag.json"

    def factory(data):
        return DiagnosticsCallback(
            [{"input_ids": data[0]["input_ids"][None]}], every_steps=2, output_file=out
        )

    trainer, _ = _train(tmp_path, factory)
    logged = [h for h in trainer.state.log_history if "diagnostics/gate_mean" in h]
    assert [h["step"] for h in logged] == [2, 4]
    reported = [logs for logs in REPORTED if "diagnostics/gate_mean" in logs]
    assert [logs["diagnostics/gate_mean"] for logs in reported] == [
        h["diagnostics/gate_mean"] for h in logged
    ]
    assert all(
        0 < h["diagnostics/gate_mean"] < 1 and "diagnostics/first_token_attention" in h for h in logged
    )
    saved = json.loads(out.read_text())
    assert [entry["step"] for entry in saved] == [0, 2, 4]
    assert len(saved[-1]["layers"]["gate_mean"]) == 2
    assert saved[0]["gate_mean"] != saved[-1]["gate_mean"]  # the gates trained

    _, resumed = _train(tmp_path, factory, max_steps=4, resume=True)  # from step 2: entry 4 is measured again
    assert [entry["step"] for entry in json.loads(out.read_text())] == [0, 2, 4]
    assert [entry["step"] for entry in resumed.history] == [0, 2, 4]


def test_callback_refuses_an_empty_probe():
    with pytest.raises(ValueError, match="probe is empty"):
        DiagnosticsCallback([], every_steps=2)


def test_cli_writes_json_and_plots_and_prints_a_table(tmp_path, capsys):
    model_dir = make_tiny_model(tmp_path / "model")
    gated = tmp_path / "gated"
    assert cli_main(["patch", str(model_dir), str(gated), "--init", "paper", "--top-k", "1"]) == 0
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": "w1 w2 w3 w4 . " * 6}) + "\n" for _ in range(3)))
    out = tmp_path / "diag"
    code = cli_main(["diagnose", str(model_dir), str(gated), "--text-file", str(texts), "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "| model | first-token attn" in printed and "| gated |" in printed
    for label in ("model", "gated"):
        result = json.loads((out / label / "diagnostics.json").read_text())
        assert result["inputs"]["count"] == 3
        for name in ("heatmaps.png", "layers.png"):
            assert (out / label / name).read_bytes()[:4] == b"\x89PNG"
    assert json.loads((out / "gated" / "diagnostics.json").read_text())["gates"]["keep_rate"] is not None
    assert (out / "summary.md").read_text().startswith("| model |")
    assert (out / "layers.png").is_file()


def test_cli_backend_flag_chooses_what_runs_the_gates(tmp_path, capsys):
    model_dir = make_tiny_model(tmp_path / "model")
    gated = tmp_path / "gated"
    assert cli_main(["patch", str(model_dir), str(gated), "--init", "paper"]) == 0
    texts = tmp_path / "texts.txt"
    texts.write_text("w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12\n")
    results = {}
    for backend in ("torch", "triton"):  # triton: the kernels through the interpreter on CPU
        out = tmp_path / backend
        args = ["diagnose", str(gated), "--text-file", str(texts), "--out", str(out), "--backend", backend]
        assert cli_main(args) == 0, capsys.readouterr().err
        results[backend] = json.loads((out / "diagnostics.json").read_text())
    assert [results[b]["model"]["backend"] for b in ("torch", "triton")] == ["torch", "triton"]
    for kind in ("first_token", "top1"):
        torch.testing.assert_close(
            torch.tensor(results["triton"]["attention"][kind]),
            torch.tensor(results["torch"]["attention"][kind]),
        )
    torch.testing.assert_close(
        torch.tensor(results["triton"]["gates"]["mean"]), torch.tensor(results["torch"]["gates"]["mean"])
    )
    with pytest.raises(SystemExit):
        cli_main(["diagnose", str(gated), "--out", str(tmp_path / "x"), "--backend", "cuda"])
    assert "invalid choice: 'cuda'" in capsys.readouterr().err


def test_cli_diagnoses_a_vision_model_on_image_files(tmp_path, capsys):
    from PIL import Image

    model = tiny_model("vit", attn_implementation="sdpa")
    model.save_pretrained(tmp_path / "vit")
    transformers.ViTImageProcessor(size={"height": 30, "width": 30}).save_pretrained(tmp_path / "vit")
    images = []
    for i in range(2):
        images.append(tmp_path / f"{i}.png")
        Image.fromarray(torch.randint(0, 255, (40, 50, 3), dtype=torch.uint8).numpy()).save(images[-1])
    code = cli_main(
        ["diagnose", str(tmp_path / "vit"), "--images", *map(str, images), "--out", str(tmp_path / "d")]
    )
    assert code == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "d" / "diagnostics.json").read_text())
    assert result["inputs"]["count"] == 2 and len(result["attention"]["first_token"]) == 2
    assert (tmp_path / "d" / "heatmaps.png").is_file()
    missing = cli_main(
        ["diagnose", str(tmp_path / "vit"), "--images", str(tmp_path / "no.png"), "--out", "x"]
    )
    assert missing == 2 and "image file(s) not found" in capsys.readouterr().err


def test_cli_bad_input_is_one_line_with_status_2(tmp_path, capsys):
    model_dir = make_tiny_model(tmp_path / "model")
    code = cli_main(
        ["diagnose", str(model_dir), "--text-file", str(tmp_path / "nope.txt"), "--out", str(tmp_path)]
    )
    assert code == 2
    assert "text file" in capsys.readouterr().err
    (tmp_path / "short.txt").write_text("w1\nw2 w3\n")
    code = cli_main(
        ["diagnose", str(model_dir), "--text-file", str(tmp_path / "short.txt"), "--out", str(tmp_path)]
    )
    assert code == 2
    assert "at least 8 tokens" in capsys.readouterr().err


def test_diagnosis_does_not_touch_model_outputs_of_task_heads():
    model = tiny_model("bert", attn_implementation="sdpa")
    inputs = _one(tiny_inputs("bert", batch=1))
    reference = first_output(model(**inputs))
    diagnose(model, [inputs])
    assert torch.equal(first_output(model(**inputs)), reference)


@pytest.mark.slow
def test_a_comparisons_models_are_diagnosed_and_missing_ones_named(recipe_results, tmp_path):
    import shutil

    from hf_gate_attention.recipes.summarization.diagnosis import diagnose_comparison

    results = tmp_path / "results"
    shutil.copytree(recipe_results, results)
    shutil.rmtree(results / "output-headwise-b" / "model")
    text = diagnose_comparison(results, tmp_path / "out", max_inputs=2, max_length=24)
    assert "| pretrained | 0." in text and "| qk-elementwise | 0." in text
    assert "Not diagnosed (no final weights" in text and "output-headwise-b" in text.split("Not diagnosed")[1]
    saved = json.loads((tmp_path / "out" / "qk-elementwise" / "diagnostics.json").read_text())
    assert saved["inputs"]["count"] == 2 and saved["gates"] is not None
    assert json.loads((tmp_path / "out" / "pretrained" / "diagnostics.json").read_text())["gates"] is None
    assert (tmp_path / "out" / "DIAGNOSTICS.md").read_text() == text
    assert (tmp_path / "out" / "layers.png").is_file()

    # weights gone since: the earlier diagnosis in the same folder is shown, and said to be earlier
    shutil.rmtree(results / "qk-elementwise" / "model")
    again = diagnose_comparison(results, tmp_path / "out", max_inputs=2, max_length=24)
    row = next(line for line in again.splitlines() if line.startswith("| qk-elementwise | qk/"))
    assert "diagnosed by an earlier run of this command" in row
    assert "qk-elementwise" not in again.split("Not diagnosed")[1] and "output-headwise-b" in again
    assert json.loads((tmp_path / "out" / "qk-elementwise" / "diagnostics.json").read_text()) == saved


def test_where_the_largest_weight_sits_is_counted_per_query():
    from hf_gate_attention.diagnostics.measure import _Recorder

    recorder = _Recorder(num_layers=1, skip_queries=2)
    weights = torch.full((1, 2, 6, 6), 0.01)
    for i in range(6):
        weights[0, 0, i, max(i - 1, 0)] = 0.9  # head 0: the previous position
        weights[0, 1, i, i if i % 2 else 0] = 0.9  # head 1: itself at odd positions, key 0 at even ones
    recorder.attention(0, weights)
    sums = {name: (recorder.sums[name][0] / recorder.queries[0]).tolist() for name in recorder.sums}
    assert sums["top1_at_previous"] == [1.0, 0.0]
    assert sums["top1_at_self"] == [0.0, 0.5] and sums["top1_at_first"] == [0.0, 0.5]


@pytest.mark.slow
def test_missing_weights_are_recreated_from_the_saved_config_and_checked(recipe_results, tmp_path):
    import shutil

    from safetensors.torch import load_file

    from hf_gate_attention.recipes.summarization.diagnosis import main as diagnosis_main
    from hf_gate_attention.recipes.summarization.recreate import main as recreate_main
    from hf_gate_attention.recipes.summarization.recreate import recreate_weights

    results = tmp_path / "results"
    shutil.copytree(recipe_results, results)
    for name in ("baseline", "qk-elementwise"):
        shutil.rmtree(results / name / "model")
    scratch = tmp_path / "scratch"
    with pytest.raises(ValueError, match=r"runs \['nope'\] are not in"):
        recreate_weights(results, scratch, only=["nope"])
    assert set(recreate_weights(results, scratch, only=["baseline"])) == {"baseline"}
    assert not (results / "qk-elementwise" / "model").exists()
    differences = recreate_weights(results, scratch) | {"baseline": 0.0}
    assert set(differences) == {"baseline", "qk-elementwise"} and max(differences.values()) <= 1e-4
    for name in differences:  # the same training: the same weights
        recreated = load_file(results / name / "model" / "model.safetensors")
        original = load_file(recipe_results / name / "model" / "model.safetensors")
        assert recreated.keys() == original.keys()
        assert all(torch.allclose(recreated[k], original[k], rtol=1e-4, atol=1e-6) for k in original)
    assert recreate_weights(results, scratch) == {}  # nothing missing any more
    assert recreate_main([str(results), "baseline", "--scratch", str(scratch)]) == 0
    assert recreate_main([str(results), "nope", "--scratch", str(scratch)]) == 2

    # a saved run whose losses differ from what its config trains: refused, nothing moved
    shutil.rmtree(results / "baseline" / "model")
    summary_file = results / "baseline" / "train_summary.json"
    summary = json.loads(summary_file.read_text())
    next(entry for entry in summary["log_history"] if "loss" in entry)["loss"] *= 1.01
    summary_file.write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"trained differently.*'baseline'.*nothing moved"):
        recreate_weights(results, scratch)
    assert not (results / "baseline" / "model").exists()
    out = tmp_path / "out"
    assert (
        diagnosis_main([str(results), "--out", str(out), "--recreate-missing", "--scratch", str(scratch)])
        == 2
    )
    assert not (out / "DIAGNOSTICS.md").exists()


@pytest.mark.parametrize(
    ("option", "value", "low"),
    [("--max-inputs", "-1", 1), ("--max-inputs", "0", 1), ("--skip-queries", "-5", 0)],
)
def test_diagnose_counts_out_of_range_are_refused(option, value, low, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli_main(["diagnose", "some-model", option, value])
    assert exit_.value.code == 2
    assert f"expected an integer >= {low}; got '{value}'" in capsys.readouterr().err


def test_a_decoder_with_gated_cross_attention_alone_is_diagnosed():
    """A GPT-2 decoder with cross-attention (one self-attention stack: no `part` needed) gated on its
    cross-attention only: no self-attention gates, its cross gates by layer (this was a KeyError)."""
    config = transformers.GPT2Config(
        vocab_size=50, n_embd=32, n_layer=2, n_head=4, add_cross_attention=True, is_decoder=True
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    patch(model, GateConfig(attention=("cross",)))
    inputs = {"input_ids": torch.tensor([[1, 2, 3, 4, 5, 6]]), "encoder_hidden_states": torch.randn(1, 5, 32)}
    result = diagnose(model, [inputs], skip_queries=1)
    assert result["gates"] is None and result["cross_gates"]["layers"] == [0, 1]
    assert result["summary"]["cross_gate_mean"] == pytest.approx(1.0)  # identity init: 2 * sigmoid(0)


def test_cli_part_diagnoses_the_decoder_of_an_encoder_decoder_with_its_cross_gates(tmp_path, capsys):
    model = zoo_model("bart")
    patch(model, GateConfig(attention=("cross",), parts=("decoder",), init="paper"))
    model.save_pretrained(tmp_path / "bart")
    make_tiny_model(tmp_path / "tokenizer")
    texts = tmp_path / "texts.txt"
    texts.write_text("w1 w2 w3 w4 w5 w6 w7 w8 w9 w10\nw3 w4 w5 w6 w7 w8 w9 w1 w2\n")
    argv = ["diagnose", str(tmp_path / "bart"), "--out", str(tmp_path / "out"), "--text-file", str(texts)]
    argv += ["--tokenizer", str(tmp_path / "tokenizer"), "--skip-queries", "1"]
    assert cli_main(argv) == 2  # two stacks: the error names --part's way out
    assert "part='decoder'" in capsys.readouterr().err
    assert cli_main([*argv, "--part", "decoder"]) == 0
    assert "cross gate mean" in capsys.readouterr().out
    result = json.loads((tmp_path / "out" / "diagnostics.json").read_text())
    assert result["model"]["part"] == "decoder" and result["gates"] is None
    assert result["cross_gates"]["layers"] == [0, 1]
