"""Gated attention under FSDP2: a 2-process training on CPU over gloo, launched like a user would (torchrun).

`fsdp_worker.py` (beside this file) runs on 2 ranks
(`python -m torch.distributed.run --standalone --nproc_per_node 2`):
a tiny Llama patched with `patch(variant="output", granularity="headwise", init="paper")`, `fully_shard`
on each decoder layer then on the whole model (what accelerate's FSDP2 plugin does with
`TRANSFORMER_BASED_WRAP`, as in `recipes/summarization/accelerate/fsdp.yaml`), 4 AdamW steps, a gathered full
state dict and `save_pretrained` on rank 0. This file checks that:

1. the gates are sharded: every `attn_gate` parameter is a DTensor placed `Shard(0)` on the 2-rank mesh, each
   rank holding a smaller local shard, the two shards adding up to the full tensor;
2. the gates are trained: the gathered gate weights differ from their (paper-init) starting values;
3. the gates are saved: the checkpoint's safetensors hold every `attn_gate` tensor, equal to the gathered
   ones;
4. the checkpoint reloads with `hf_gate_attention.from_pretrained` and gives the same fp32 logits as an
   unsharded patched model loaded with the gathered state dict, and as the sharded model itself.

Why raw `fully_shard` and not the Trainer/accelerate path (accelerate 1.16.0, transformers 5.24.0, torch
2.13 CPU): on a machine without an accelerator, `TrainingArguments(fsdp=True, fsdp_config={"version": 2,
...}, use_cpu=True)` trains with DDP instead, without any error. The Trainer does build accelerate's
`FullyShardedDataParallelPlugin`, but `accelerate/state.py` (`AcceleratorState.__init__`) switches to
`DistributedType.FSDP` only inside `elif self.distributed_type in [MULTI_GPU, MULTI_MLU, MULTI_SDAA,
MULTI_MUSA, MULTI_NPU, MULTI_XPU, MULTI_HPU, MULTI_NEURON]`; on CPU `PartialState._prepare_backend` gives
`MULTI_CPU` (or `NO` without `use_cpu`), so the plugin is dropped and the model is wrapped in
DistributedDataParallel (the only trace: torch's "find_unused_parameters=True was specified in DDP
constructor" warning; `accelerator.distributed_type` is `MULTI_CPU`, `is_fsdp2` is False, the gates stay
plain tensors). DeepSpeed is skipped on CPU the same way (`... == "true" and not cpu`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import transformers
from helpers import REPO, tiny_model, torchrun
from safetensors import safe_open
from torch.distributed.tensor import Shard

from hf_gate_attention import from_pretrained, gate_parameters, patch

pytestmark = pytest.mark.slow  # a 2-process torchrun
WORKER = Path(__file__).with_name("fsdp_worker.py")
WORLD_SIZE = 2
GATE = {"variant": "output", "granularity": "headwise", "init": "paper"}  # as in the worker
NUM_LAYERS = 2
GATE_KEYS = sorted(
    f"model.layers.{i}.self_attn.attn_gate.{name}" for i in range(NUM_LAYERS) for name in ("weight", "bias")
)


def eval_inputs() -> torch.Tensor:
    """The worker's fixed evaluation inputs (same generator and seed)."""
    return torch.randint(3, 99, (2, 12), generator=torch.Generator().manual_seed(123))


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory) -> dict:
    """Runs the 2-process FSDP2 training once; returns its folders and the ranks' reports."""
    root = tmp_path_factory.mktemp("fsdp")
    tiny_model("llama", num_hidden_layers=NUM_LAYERS).save_pretrained(root / "base")
    out = root / "out"
    out.mkdir()
    torchrun(str(WORKER), str(root / "base"), str(out), timeout=300)
    reports = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(WORLD_SIZE)]
    return {"base": root / "base", "out": out, "reports": reports}


def test_workers_sharded_the_decoder_layers_and_the_model(fsdp_run):
    for report in fsdp_run["reports"]:
        assert report["world_size"] == WORLD_SIZE
        assert Path(report["package"]).is_relative_to(REPO), f"worker imported {report['package']}"
        expected = ["", *(f"model.layers.{i}" for i in range(NUM_LAYERS))]
        assert sorted(report["fsdp_modules"]) == expected, f"rank {report['rank']}: FSDP modules"
        assert report["model_class"] == "FSDPLlamaForCausalLM"
        assert len(report["losses"]) == 4 and all(map(math.isfinite, report["losses"]))


@pytest.mark.parametrize("when", ["gates_after_sharding", "gates_after_training"])
def test_gates_are_sharded_across_the_ranks(fsdp_run, when):
    reports = fsdp_run["reports"]
    for report in reports:
        gates = report[when]
        assert sorted(gates) == GATE_KEYS, f"rank {report['rank']}: gate parameters {sorted(gates)}"
        for name, gate in gates.items():
            where = f"rank {report['rank']}, {name} ({when})"
            assert gate["dtensor"], f"{where} is a {gate['type']}, not a DTensor"
            assert gate["placements"] == [str(Shard(0))], f"{where} is placed {gate['placements']}"
            assert gate["mesh_size"] == WORLD_SIZE, f"{where} is on a mesh of {gate['mesh_size']}"
            local, full = torch.Size(gate["local_shape"]), torch.Size(gate["full_shape"])
            assert local.numel() < full.numel(), f"{where}: local shard {local} is not smaller than {full}"
    for name in GATE_KEYS:
        shards = [report[when][name]["local_shape"] for report in reports]
        full = reports[0][when][name]["full_shape"]
        assert sum(s[0] for s in shards) == full[0] and all(s[1:] == full[1:] for s in shards), (
            f"{name}: the ranks' shards {shards} do not make up the full shape {full}"
        )


def test_gates_are_trained(fsdp_run):
    initial = torch.load(fsdp_run["out"] / "initial_gates.pt")
    full = torch.load(fsdp_run["out"] / "full_state_dict.pt")
    assert sorted(initial) == GATE_KEYS
    assert initial[GATE_KEYS[-1]].abs().max() > 0, "paper init should give nonzero gate weights"
    for key in GATE_KEYS:
        moved = (full[key] - initial[key]).abs().max().item()
        assert moved > 1e-3, f"{key} moved by only {moved:.2e} in 4 AdamW steps at lr 1e-2"


def test_gates_are_saved(fsdp_run):
    folder = fsdp_run["out"] / "model"
    full = torch.load(fsdp_run["out"] / "full_state_dict.pt")
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        saved = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)
    assert sorted(k for k in saved if ".attn_gate." in k) == GATE_KEYS, f"saved keys: {sorted(saved)}"
    assert sorted(saved) == sorted(full), "the checkpoint does not hold the whole gathered state dict"
    for key, tensor in saved.items():
        torch.testing.assert_close(tensor, full[key], rtol=0, atol=0, msg=lambda m, k=key: f"saved {k}: {m}")
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["GatedLlamaForCausalLM"] and config["model_type"] == "gated_llama"
    assert {k: config["gate_attention"][k] for k in GATE} == GATE


def test_checkpoint_reloads_with_the_same_outputs_as_an_unsharded_model(fsdp_run):
    full = torch.load(fsdp_run["out"] / "full_state_dict.pt")
    loaded = from_pretrained(str(fsdp_run["out"] / "model"), dtype=torch.float32, attn_implementation="eager")
    loaded.eval()
    for name, param in loaded.named_parameters():
        if ".attn_gate." in name:
            torch.testing.assert_close(
                param.detach(), full[name], rtol=0, atol=0, msg=lambda m, n=name: f"reloaded {n}: {m}"
            )
    assert len(list(gate_parameters(loaded))) == len(GATE_KEYS)

    unsharded = transformers.AutoModelForCausalLM.from_pretrained(
        fsdp_run["base"], dtype=torch.float32, attn_implementation="eager"
    )
    patch(unsharded, **GATE)
    unsharded.load_state_dict(full, strict=True)  # raises unless the keys are exactly the patched model's
    unsharded.eval()
    ids = eval_inputs()
    with torch.no_grad():
        expected = unsharded(input_ids=ids).logits
        got = loaded(input_ids=ids).logits
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, msg=lambda m: f"reloaded vs unsharded model logits: {m}")
    fsdp_logits = torch.load(fsdp_run["out"] / "fsdp_logits.pt")
    torch.testing.assert_close(got, fsdp_logits, msg=lambda m: f"reloaded vs sharded model logits: {m}")


def test_checkpoint_also_loads_with_trust_remote_code(fsdp_run):
    """`fully_shard` renames the class (`FSDPLlamaForCausalLM`): the remote code's class still derives its
    name from transformers' (`Gated` + `LlamaForCausalLM`)."""
    folder = fsdp_run["out"] / "model"
    config = json.loads((folder / "config.json").read_text())
    assert "auto_map" in config and (folder / "modeling_gated_attention.py").is_file()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        folder, trust_remote_code=True, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    assert type(loaded).__name__ == "GatedLlamaForCausalLM"
    # the remote code's own AttentionGate class, not ours: count the gate tensors by name
    assert sorted(n for n, _ in loaded.named_parameters() if ".attn_gate." in n) == GATE_KEYS
    with torch.no_grad():
        got = loaded(input_ids=eval_inputs()).logits
    torch.testing.assert_close(got, torch.load(fsdp_run["out"] / "fsdp_logits.pt"))
