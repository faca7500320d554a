"""What a card is made of: a gated checkpoint folder and, optionally, the recipe's results folder."""

from __future__ import annotations

import math
from pathlib import Path

from ...core.config import GateConfig
from ...core.hooks import CONFIG_ATTRIBUTE, GATE_MODULE_NAME
from ...core.model_type import base_names, is_gated_model_type
from ...files import open_safetensors, read_json
from ...formatting import gate_label


def _listing(folder: Path) -> str:
    if not folder.is_dir():
        return "no such folder"
    return ", ".join(sorted(p.name for p in folder.iterdir())) or "nothing"


def safetensors_shards(folder: Path) -> list[str]:
    """File names of the safetensors weights in `folder` (single file or sharded); `ValueError` if none."""
    index = read_json(folder / "model.safetensors.index.json")
    if index is not None:
        return sorted(set(index["weight_map"].values()))
    if (folder / "model.safetensors").is_file():
        return ["model.safetensors"]
    raise ValueError(
        f"{folder} holds no safetensors weights (model.safetensors or model.safetensors.index.json); "
        f"found: {_listing(folder)}"
    )


def parameter_count(folder: Path) -> int:
    """Parameters stored in the safetensors weights of `folder`, from the headers only."""
    total = 0
    for shard in safetensors_shards(folder):
        with open_safetensors(folder / shard) as f:
            total += sum(math.prod(f.get_slice(key).get_shape()) for key in f.keys())  # noqa: SIM118
    return total


def read_checkpoint(folder: str | Path) -> dict:
    """The gate config, architecture and parameter counts of a gated checkpoint folder.

    Counts come from the safetensors headers (single file or sharded); only the small gate tensors are
    read, to see whether they are still all zero. Raises `ValueError` when `folder` is not a gated checkpoint.
    """
    folder = Path(folder)
    config = read_json(folder / "config.json")
    if config is None:
        raise ValueError(
            f"{folder} is not a gated checkpoint: it has no config.json (found: {_listing(folder)})"
        )
    if CONFIG_ATTRIBUTE not in config:
        raise ValueError(
            f"{folder} is not a gated checkpoint: its config.json has no {CONFIG_ATTRIBUTE!r} entry "
            f"(model_type={config.get('model_type')!r}, architectures={config.get('architectures')!r}). "
            "Save a model patched with hf_gate_attention.patch"
        )
    total = added = 0
    dtypes, gated_blocks, gates_all_zero = set(), set(), True
    for shard in safetensors_shards(folder):
        with open_safetensors(folder / shard) as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                tensor = f.get_slice(key)
                count = math.prod(tensor.get_shape())
                total += count
                dtypes.add(tensor.get_dtype())
                if f".{GATE_MODULE_NAME}." in key:
                    added += count
                    gated_blocks.add(key.split(f".{GATE_MODULE_NAME}.")[0])
                    gates_all_zero = gates_all_zero and not f.get_tensor(key).any()
    gate = GateConfig.from_saved(config[CONFIG_ATTRIBUTE])
    # init="identity" gates with all-zero weights are exactly 1 (without top_k): the ungated model
    identity = bool(gated_blocks) and gates_all_zero and gate.init == "identity" and gate.top_k is None
    return {
        "config": base_names(config),  # what the card describes: the base model type and class, gated
        "gated_names": is_gated_model_type(config.get("model_type")),
        "gate": gate,
        "total_params": total,
        "added_params": added,
        "gated_layers": len(gated_blocks),
        "dtypes": sorted(dtypes),
        "gates_are_identity": identity,
    }


def _gate_key(gate: dict) -> dict:
    """A saved gate config (also of older versions, which saved a `backend`), normalised."""
    return GateConfig.from_saved(gate).to_dict()


def _gate_label(gate: dict | None) -> str:
    return gate_label(gate, baseline="no gate, baseline")


def read_results(results: str | Path, gate: GateConfig, run: str | None = None) -> dict:
    """This checkpoint's run, the baseline and the config in a recipe's results folder (`comparison.json` with
    a row `{run, gate, ...}` per run, `<run>/metrics.json`).

    `run` defaults to the single gated run whose gate equals `gate`; `ValueError` names
    the runs when none or several match, or when `run` is missing, the baseline, or has another gate.
    """
    results = Path(results)
    comparison = read_json(results / "comparison.json")
    if comparison is None:
        raise ValueError(
            f"{results} has no comparison.json: it is not a finished results folder of a recipe (found: "
            f"{_listing(results)})"
        )
    rows = comparison["runs"]
    runs = ", ".join(f"{r['run']!r} ({_gate_label(r['gate'])})" for r in rows)
    wanted = _gate_key(gate.to_dict())
    if run is None:
        matches = [r for r in rows if r["gate"] is not None and _gate_key(r["gate"]) == wanted]
        if len(matches) != 1:
            which = "several runs" if matches else "no run"
            raise ValueError(
                f"{which} in {results} have the checkpoint's gate ({_gate_label(wanted)}); pass `run`, one "
                f"of: {runs}"
            )
        row = matches[0]
    else:
        row = next((r for r in rows if r["run"] == run), None)
        if row is None:
            raise ValueError(f"run {run!r} is not in {results}; its runs: {runs}")
        if row["gate"] is None or _gate_key(row["gate"]) != wanted:
            raise ValueError(
                f"run {run!r} of {results} has {_gate_label(row['gate'])} but the checkpoint has "
                f"{_gate_label(wanted)}; runs: {runs}"
            )
    metrics = read_json(results / row["run"] / "metrics.json")
    if metrics is None:
        raise ValueError(f"{results / row['run']} has no metrics.json: the comparison did not finish")
    baseline = next((r for r in rows if r["gate"] is None), None)
    return {"name": results.name, "config": comparison["config"], "run": metrics, "baseline": baseline}
