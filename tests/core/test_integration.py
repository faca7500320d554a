"""Patched models inside the rest of the ecosystem: generate, padding, checkpointing, compile, dtypes, PEFT,
Trainer, save/load."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from helpers import VARIANTS, first_output, tiny_inputs, tiny_model

import hf_gate_attention
from hf_gate_attention import gate_parameters, patch, unpatch


def _gated(model_type="llama", variant="output", **kwargs):
    return patch(tiny_model(model_type, **kwargs), variant=variant, granularity="elementwise", init="paper")


@pytest.mark.parametrize("variant", VARIANTS)
def test_generate_with_and_without_cache_and_identity_equals_unpatched(variant):
    prompt = tiny_inputs("llama", batch=2, length=6)["input_ids"]
    settings = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
    model = _gated(variant=variant)
    cached = model.generate(prompt, use_cache=True, **settings)
    assert torch.equal(cached, model.generate(prompt, use_cache=False, **settings))

    plain = tiny_model("llama")
    expected = plain.generate(prompt, **settings)
    patch(plain, variant=variant)  # identity init
    assert torch.equal(plain.generate(prompt, use_cache=True, **settings), expected)
    assert torch.equal(plain.generate(prompt, use_cache=False, **settings), expected)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("model_type", ["llama", "bert"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_padded_batch_equals_one_at_a_time(model_type, variant, side):
    model = _gated(model_type, variant).base_model  # token states: a task head may pool the first position
    lengths = [9, 5, 7]
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)  # 0 is the pad id
    mask = torch.zeros_like(ids)
    positions = torch.zeros_like(ids)
    sequences = [tiny_inputs(model_type, batch=1, length=n, seed=n)["input_ids"][0] for n in lengths]
    for row, seq in enumerate(sequences):
        span = slice(width - len(seq), width) if side == "left" else slice(0, len(seq))
        ids[row, span], mask[row, span], positions[row, span] = seq, 1, torch.arange(len(seq))
    with torch.no_grad():
        batched = first_output(model(input_ids=ids, attention_mask=mask, position_ids=positions))
        for row, seq in enumerate(sequences):
            single = first_output(model(input_ids=seq[None], position_ids=torch.arange(len(seq))[None]))
            torch.testing.assert_close(batched[row][mask[row].bool()], single[0], atol=1e-5, rtol=1e-4)


def _loss_and_gate_grads(model, inputs):
    model.zero_grad()
    loss = model(**inputs, labels=inputs["input_ids"]).loss
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in gate_parameters(model)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_gradient_checkpointing_gives_the_same_gradients(variant):
    model = _gated(variant=variant).train()
    inputs = tiny_inputs("llama")
    loss, grads = _loss_and_gate_grads(model, inputs)
    assert all(g.abs().sum() > 0 for g in grads)
    model.gradient_checkpointing_enable()
    assert model.model.gradient_checkpointing
    loss_ckpt, grads_ckpt = _loss_and_gate_grads(model, inputs)
    torch.testing.assert_close(loss_ckpt, loss)
    for g_ckpt, g in zip(grads_ckpt, grads, strict=True):
        torch.testing.assert_close(g_ckpt, g)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.slow
def test_torch_compile_gives_the_same_outputs(variant):
    torch._dynamo.reset()
    model = _gated(variant=variant)
    inputs = tiny_inputs("llama")
    with torch.no_grad():
        expected = model(**inputs).logits
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        torch.testing.assert_close(compiled(**inputs).logits, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dtypes_and_device_moves(dtype):
    model = tiny_model("llama")
    inputs = tiny_inputs("llama")
    model = model.to(device="cpu", dtype=dtype)
    with torch.no_grad():
        expected = model(**inputs).logits
        patch(model, variant="output")
        gate = model.model.layers[0].self_attn.attn_gate
        assert gate.weight.dtype == dtype and gate.weight.device.type == "cpu"
        assert torch.equal(model(**inputs).logits, expected)  # identity is exact in every dtype
        unpatch(model)
        patch(model, variant="qk", init="paper")
        model = model.to("cpu")
        logits = model(**inputs).logits
    assert logits.dtype == dtype and torch.isfinite(logits).all()


def test_peft_lora_on_a_patched_model_trains_gates_and_reloads(tmp_path):
    peft = pytest.importorskip("peft")
    model = _gated()
    lora = peft.LoraConfig(
        r=4,
        target_modules=["q_proj", "v_proj", "o_proj"],
        modules_to_save=["attn_gate"],
        init_lora_weights=False,
    )
    peft_model = peft.get_peft_model(model, lora)
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert any("attn_gate" in n for n in trainable) and any("lora_A" in n for n in trainable)

    inputs = tiny_inputs("llama")
    optimizer = torch.optim.SGD([p for p in peft_model.parameters() if p.requires_grad], lr=0.5)
    before = [
        p.detach().clone() for n, p in peft_model.named_parameters() if "attn_gate" in n and p.requires_grad
    ]
    peft_model(**inputs, labels=inputs["input_ids"]).loss.backward()
    optimizer.step()
    after = [p for n, p in peft_model.named_parameters() if "attn_gate" in n and p.requires_grad]
    assert all(not torch.equal(a, b) for a, b in zip(after, before, strict=True))

    peft_model.eval()
    peft_model.save_pretrained(tmp_path)
    with torch.no_grad():
        expected = peft_model(**inputs).logits
        reloaded = peft.PeftModel.from_pretrained(_gated(), tmp_path).eval()
        torch.testing.assert_close(reloaded(**inputs).logits, expected, atol=1e-6, rtol=0)
        # the gate sits in front of the whole LoRA-wrapped o_proj: merging LoRA must not change the output
        merged = peft_model.merge_and_unload()
        torch.testing.assert_close(merged(**inputs).logits, expected, atol=1e-5, rtol=1e-4)


def _data_parallel_replica(model: torch.nn.Module) -> torch.nn.Module:
    """What `torch.nn.parallel.replicate` (`nn.DataParallel`) makes of `model` for one device, without the
    devices: every module a replica (`_replicate_for_data_parallel`, sharing the original's hook dicts), its
    children the replicas of the original's, its parameters plain tensor attributes."""
    replicas = {module: module._replicate_for_data_parallel() for module in model.modules()}
    for original, replica in replicas.items():
        for name, child in original._modules.items():
            replica._modules[name] = None if child is None else replicas[child]
        for name, param in original._parameters.items():
            replica.__dict__[name] = param
    return replicas[model]


def test_a_data_parallel_replica_is_refused_with_the_alternatives():
    """`nn.DataParallel` replicas would share the original's block patches (one stash across its threads):
    replicating the gate is refused, naming what to do instead; the original still runs."""
    model = _gated()
    inputs = tiny_inputs("llama")
    with torch.no_grad():
        expected = model(**inputs).logits
        with pytest.raises(RuntimeError, match=r"DataParallel.*torchrun"):
            _data_parallel_replica(model)(**inputs)
        torch.testing.assert_close(model(**inputs).logits, expected, rtol=0, atol=0)


def test_patching_a_peft_model():
    peft = pytest.importorskip("peft")
    peft_model = peft.get_peft_model(tiny_model("llama"), peft.LoraConfig(r=4, target_modules=["o_proj"]))
    inputs = tiny_inputs("llama")
    with torch.no_grad():
        expected = peft_model(**inputs).logits
        patch(peft_model)
        assert hf_gate_attention.is_patched(peft_model)
        assert torch.equal(peft_model(**inputs).logits, expected)
        unpatch(peft_model)
        assert not any("attn_gate" in n for n, _ in peft_model.named_parameters())


def test_trainer_lowers_the_loss_and_updates_the_gates(tmp_path):
    model = patch(tiny_model("llama").train(), variant="output", train_gates_only=False)
    ids = tiny_inputs("llama", batch=8, length=16)["input_ids"]
    dataset = [{"input_ids": row, "labels": row} for row in ids]
    gates_before = [p.detach().clone() for p in gate_parameters(model)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=12,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=dataset)
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert losses[-1] < losses[0] * 0.9
    assert all(not torch.equal(p, b) for p, b in zip(gate_parameters(model), gates_before, strict=True))


@pytest.mark.parametrize("model_type", ["llama", "bert", "vit", "phi3"])
def test_save_pretrained_then_from_pretrained_restores_the_gated_model(model_type, tmp_path):
    model = patch(
        tiny_model(model_type), variant="qk", granularity="headwise", init="paper", top_k=2, layers=[1]
    )
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["gate_attention"] == hf_gate_attention.gate_config_of(model).to_dict()

    loaded = hf_gate_attention.from_pretrained(str(tmp_path), attn_implementation="eager").eval()
    assert type(loaded) is type(model)
    assert hf_gate_attention.gate_config_of(loaded) == hf_gate_attention.gate_config_of(model)
    reference, restored = model.state_dict(), loaded.state_dict()
    assert reference.keys() == restored.keys()
    assert all(torch.equal(reference[k], restored[k]) for k in reference)
    inputs = tiny_inputs(model_type)
    with torch.no_grad():
        assert torch.equal(first_output(loaded(**inputs)), first_output(model(**inputs)))


def test_from_pretrained_errors(tmp_path):
    plain = tiny_model("llama")
    plain.save_pretrained(tmp_path / "plain")
    with pytest.raises(ValueError, match="not a gated checkpoint"):
        hf_gate_attention.from_pretrained(str(tmp_path / "plain"))
    gated = patch(tiny_model("llama"), granularity="elementwise")
    gated.save_pretrained(tmp_path / "gated")
    config = json.loads((tmp_path / "gated" / "config.json").read_text())
    config["gate_attention"]["granularity"] = "headwise"
    (tmp_path / "gated" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"attn_gate.weight has shape \(32, 32\).*expects \(4, 32\)"):
        hf_gate_attention.from_pretrained(str(tmp_path / "gated"))
