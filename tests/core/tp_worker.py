"""One rank of the tensor-parallel test (`test_tensor_parallel.py`), launched by `torch.distributed.run` on
CPU over gloo, as a user launches a TP run.

Usage: `python -m torch.distributed.run --standalone --nproc_per_node N tests/core/tp_worker.py CASES OUT`.

`CASES` is a JSON list of cases, each a dict:
- `name`: the file rank 0 writes, `OUT/<name>.pt`;
- `load`: how the model is loaded with TP (`tp_plan="auto"` or `DistributedConfig(tp_size=N)`):
  `"package"` (`hf_gate_attention.from_pretrained(path, tp_plan="auto")`), `"distributed_config"` (the same
  with `distributed_config=`), `"remote"` (`AutoModelForCausalLM.from_pretrained(path,
  trust_remote_code=True, tp_plan="auto")`), `"adapter"` (transformers' ungated model at `path`, then
  `load_gate_adapter(model, adapter)`), `"patch"` (the ungated model, then `patch(model, **gate)`);
- `path`, and `adapter` / `gate` where the load needs them; `tp_plan`: `DistributedConfig.tp_plan` rules;
- `train`: `"all"` (every parameter), `"gates"` (`freeze_all_but_gates`) or absent (inference only);
- `generate`: whether to run a greedy `generate`;
- `save`: whether every rank calls `save_pretrained(OUT/<name>-saved)` (before any training).

Each rank runs every case and checks nothing itself; rank 0 writes what the TP model computed: the logits on
fixed inputs; with `train`, the gradient of every trainable parameter (gathered to full tensors) of the loss
on those inputs and the logits after one SGD step; with `generate`, the generated ids. A case that raises
writes `{"error": message}` instead (the test checks the refusals' messages).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, DistributedConfig

import hf_gate_attention
from hf_gate_attention import freeze_all_but_gates, load_gate_adapter, patch

LEARNING_RATE = {"all": 0.1, "gates": 1.0}  # the gates alone: a step that moves the logits
NEW_TOKENS = 6


def inputs() -> torch.Tensor:
    """The fixed token ids the test compares on (never the pad id 0)."""
    return torch.randint(3, 99, (2, 11), generator=torch.Generator().manual_seed(7))


def load(case: dict, size: int):
    distributed = DistributedConfig(tp_size=size, tp_plan=case.get("tp_plan"))
    tp = {"distributed_config": distributed} if case["load"] != "package" else {}
    tp = tp or {"tp_plan": "auto"}
    if case["load"] in ("package", "distributed_config"):
        return hf_gate_attention.from_pretrained(case["path"], **tp)
    if case["load"] == "remote":
        return AutoModelForCausalLM.from_pretrained(case["path"], trust_remote_code=True, **tp)
    model = AutoModelForCausalLM.from_pretrained(case["path"], **tp)
    if case["load"] == "adapter":
        return load_gate_adapter(model, case["adapter"])
    return patch(model, **case["gate"])


def full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def computed(model, case: dict) -> dict:
    """What the test compares for `case`: the logits on `inputs()`, then with `generate` the greedy ids, and
    with `train` the gradient of every trainable parameter (full tensors) and the logits after an SGD step.
    The test computes the same in one process with this function."""
    ids = inputs()
    with torch.no_grad():
        result = {"logits": model(input_ids=ids).logits}
    if case.get("generate"):
        result["generated"] = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
    if case.get("train"):
        if case["train"] == "gates":
            freeze_all_but_gates(model)
        trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
        optimizer = torch.optim.SGD(trainable.values(), lr=LEARNING_RATE[case["train"]])
        model(input_ids=ids, labels=ids).loss.backward()
        result["grads"] = {name: full(p.grad) for name, p in trainable.items()}
        optimizer.step()
        with torch.no_grad():
            result["logits_after_step"] = model(input_ids=ids).logits
    return result


def run(case: dict, size: int, out: Path) -> dict:
    model = load(case, size)
    if case.get("save"):
        model.save_pretrained(out / f"{case['name']}-saved")
    return computed(model, case)


def main(cases_file: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    for case in json.loads(Path(cases_file).read_text()):
        try:
            result = run(case, size, Path(out))
        except (ValueError, RuntimeError) as error:
            result = {"error": str(error)}
        if rank == 0:
            torch.save(result, Path(out) / f"{case['name']}.pt")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
