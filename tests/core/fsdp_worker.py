"""One rank of the FSDP2 test (`test_fsdp.py`), launched by `torch.distributed.run` on CPU over gloo.

Usage: `python -m torch.distributed.run --standalone --nproc_per_node 2 tests/core/fsdp_worker.py MODEL OUT`.

Raw `torch.distributed.fsdp.fully_shard`, as accelerate's FSDP2 plugin applies it with
`TRANSFORMER_BASED_WRAP` (each decoder layer, then the whole model): the Trainer/accelerate path cannot shard
on CPU (see `test_fsdp.py`). Each rank patches the tiny model in `MODEL` with the same seeded gates,
shards it, checks nothing itself and writes what it saw to `OUT/rank<N>.json` (gate placements and shard
shapes, losses); then a few AdamW steps on random token ids (different per rank), a gathered full state dict
(`get_model_state_dict(full_state_dict=True, cpu_offload=True)`), and on rank 0: the initial gates
(`OUT/initial_gates.pt`), the gathered state dict (`OUT/full_state_dict.pt`), the sharded model's logits on
fixed inputs (`OUT/fsdp_logits.pt`) and `save_pretrained(OUT/model, state_dict=...)`. The test checks it all.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

import hf_gate_attention
from hf_gate_attention import gate_parameters, patch

STEPS = 4
BATCH = 2
LENGTH = 12
VOCAB = 99
LEARNING_RATE = 1e-2
GATE = {"variant": "output", "granularity": "headwise", "init": "paper"}
GATE_SEED = 0  # the same paper init of the gates on every rank (FSDP2 shards each rank's own copy)


def eval_inputs() -> torch.Tensor:
    """Fixed token ids (never the pad id 0) on which the test compares logits."""
    return torch.randint(3, VOCAB, (2, LENGTH), generator=torch.Generator().manual_seed(123))


def describe_gates(model) -> dict[str, dict]:
    """Type, placements and local/full shapes of every gate parameter, by parameter name."""
    gate_ids = {id(p) for p in gate_parameters(model)}
    out = {}
    for name, param in model.named_parameters():
        if id(param) not in gate_ids:
            continue
        is_dtensor = isinstance(param, DTensor)
        out[name] = {
            "type": type(param).__name__,
            "dtensor": is_dtensor,
            "placements": [str(p) for p in param.placements] if is_dtensor else None,
            "mesh_size": param.device_mesh.size() if is_dtensor else None,
            "local_shape": list(param.to_local().shape if is_dtensor else param.shape),
            "full_shape": list(param.shape),
        }
    return out


def main(model_dir: str, out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    out = Path(out_dir)

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    torch.manual_seed(GATE_SEED)
    patch(model, **GATE)
    initial = {name: p.detach().clone() for name, p in model.named_parameters() if ".attn_gate." in name}

    mesh = init_device_mesh("cpu", (world_size,))
    for layer in model.model.layers:  # what TRANSFORMER_BASED_WRAP does (_no_split_modules = decoder layers)
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    sharded = describe_gates(model)

    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    data = torch.randint(3, VOCAB, (STEPS, BATCH, LENGTH), generator=torch.Generator().manual_seed(10 + rank))
    model.train()
    losses = []
    for ids in data:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())

    model.eval()
    with torch.no_grad():
        fsdp_logits = model(input_ids=eval_inputs()).logits  # a forward of the sharded model, on all ranks
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    report = {
        "rank": rank,
        "world_size": world_size,
        "package": hf_gate_attention.__file__,
        "model_class": type(model).__name__,
        "fsdp_modules": [n for n, m in model.named_modules() if isinstance(m, FSDPModule)],
        "gates_after_sharding": sharded,
        "gates_after_training": describe_gates(model),
        "losses": losses,
        "full_state_dict_keys": len(full),  # the full state dict lands on rank 0 only (cpu_offload)
    }
    if rank == 0:
        torch.save(initial, out / "initial_gates.pt")
        torch.save(full, out / "full_state_dict.pt")
        torch.save(fsdp_logits, out / "fsdp_logits.pt")
        model.save_pretrained(out / "model", state_dict=full)
    (out / f"rank{rank}.json").write_text(json.dumps(report, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    transformers.logging.set_verbosity_error()
    main(*sys.argv[1:])
