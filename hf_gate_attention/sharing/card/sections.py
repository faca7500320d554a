"""The card's Markdown sections: the gate, training and evaluation (as the recipe describes them), loading
without this package, limitations."""

from __future__ import annotations

from pathlib import Path

import transformers

from ...core.hooks import CONFIG_ATTRIBUTE, GATE_MODULE_NAME
from ...formatting import table
from .metadata import architecture_suffix
from .results import RecipeResults

NO_RESULTS = "No evaluation results were recorded for this checkpoint."
GRANULARITIES = {"headwise": "one gate value per head", "elementwise": "one gate value per head channel"}


def gate_summary(gate) -> str:
    """What a `GateConfig` adds, in words: its variant's description and its granularity."""
    return f"{gate.gate_variant.description}, {GRANULARITIES[gate.granularity]}"


def shown(name: str) -> str:
    """A Hub id or short name as is; a local path by its last component (no machine paths in the card)."""
    return f"local `{Path(name).name}`" if Path(name).exists() or Path(name).is_absolute() else f"`{name}`"


def gate_section(ckpt: dict) -> str:
    gate, config = ckpt["gate"], ckpt["config"]
    layers = config.get("num_hidden_layers")
    init = {
        "identity": "`identity`: gate = 2*sigmoid(z) with zero-initialised weights, exactly 1 at the start",
        "paper": "`paper`: gate = sigmoid(z) with normal-initialised weights, about 0.5 at the start",
    }[gate.init]
    rows = [
        ["variant", f"`{gate.variant}`: {gate.gate_variant.description}"],
        ["granularity", f"`{gate.granularity}`: {GRANULARITIES[gate.granularity]}"],
        ["init", init],
        [
            "top_k",
            "none (every head kept)"
            if gate.top_k is None
            else f"{gate.top_k}: per token only the {gate.top_k} heads with the largest gates are kept",
        ],
        ["gated layers", f"{ckpt['gated_layers']}" + (f" of {layers}" if layers else "")],
        [
            "added parameters",
            f"{ckpt['added_params']:,} ({100 * ckpt['added_params'] / ckpt['total_params']:.3f} % of "
            f"{ckpt['total_params']:,} stored parameters)",
        ],
        ["stored dtype", ", ".join(ckpt["dtypes"])],
    ]
    return (
        table(["gate", ""], rows)
        + f"\n\n`config.json` holds the gate config under `{CONFIG_ATTRIBUTE}`; the gate weights are the "
        f"tensors `*.{GATE_MODULE_NAME}.weight` / `.bias` of the safetensors weights."
    )


def usage_without(ckpt: dict, repo_id: str) -> str:
    config = ckpt["config"]
    derived = f"AutoModel{architecture_suffix(config)}"
    derived = derived if hasattr(transformers, derived) else "AutoModel"
    auto_map = config.get("auto_map") or {}
    model_keys = [key for key in auto_map if key.startswith("AutoModel")]
    auto_class = derived if derived in model_keys or not model_keys else model_keys[0]
    code = (
        f"```python\nfrom transformers import {auto_class}\n\n"
        f'model = {auto_class}.from_pretrained("{repo_id}", trust_remote_code=True)\n```'
    )
    if model_keys:
        target = auto_map[auto_class]
        target = target[0] if isinstance(target, list) else target
        return (
            f"{code}\n\n`trust_remote_code=True` runs the code this repository ships for `{target}` (through "
            "`auto_map` in `config.json`); read it before trusting it."
        )
    if ckpt.get("gated_names"):
        return (
            "> **Note:** this checkpoint's `config.json` has no `auto_map` entry and names the model type "
            f"`gated_{config.get('model_type')}`: transformers alone refuses to load it. Use "
            "hf-gate-attention as above."
        )
    return (
        f"{code}\n\n> **Note:** this checkpoint's `config.json` has no `auto_map` entry, so transformers "
        f"alone loads the plain `{(config.get('architectures') or ['?'])[0]}` without the gates and ignores "
        f"the `{GATE_MODULE_NAME}` weights (it warns about unexpected keys): its outputs differ from the "
        "gated model's. Use hf-gate-attention as above."
    )


def serving_section(ckpt: dict, repo_id: str) -> str:
    """How to serve the checkpoint (docs/serving.md): transformers' server with the package's loader, and
    for a qwen3 output gate without top-k the conversion to Qwen3.5's layout that vLLM and SGLang serve."""
    text = (
        "An OpenAI-compatible server (transformers' `serve`, with the gated model loaded by "
        "hf-gate-attention; `pip install 'hf-gate-attention[serving]'`):\n\n"
        f"```bash\nhf-gate-attention serve {repo_id} --continuous-batching\n```\n\n"
        "`transformers serve` itself, vLLM and SGLang refuse this checkpoint rather than serve it without "
        "its gates (its `config.json` names the model type "
        f"`gated_{ckpt['config'].get('model_type')}`)."
    )
    gate = ckpt["gate"]
    if ckpt["config"].get("model_type") == "qwen3" and gate.variant == "output" and gate.top_k is None:
        text += (
            " Its gates map exactly onto Qwen3.5's gated attention, which vLLM serves natively: "
            f"`hf-gate-attention convert {repo_id} out-qwen3_5 --to qwen3_5` writes a plain "
            "`Qwen3_5ForCausalLM` checkpoint (see the hf-gate-attention docs on serving)."
        )
    return text


def training_section(res: RecipeResults | None) -> str:
    return "Not recorded: no recipe results were given for this checkpoint." if res is None else res.training


def evaluation_section(res: RecipeResults | None) -> str:
    return NO_RESULTS if res is None else res.evaluation


def limitations(ckpt: dict, res: RecipeResults | None) -> str:
    gate = ckpt["gate"]
    no_results = f"{NO_RESULTS} Its quality relative to the ungated base model is unknown."
    items = [no_results] if res is None else list(res.limitations)
    if ckpt["gates_are_identity"]:
        items.append(
            'The gate weights are all zero: with `init="identity"` every gate is exactly 1, so this '
            "checkpoint computes exactly what the ungated model computes."
        )
    if gate.top_k is not None:
        units = "key/value groups" if gate.top_k_unit == "kv_group" else "heads"
        saving = (
            f"With hf-gate-attention installed, the attention of the dropped {units} is skipped (the "
            "projections still run for every head); with transformers alone (`trust_remote_code=True`) it "
            "is computed and masked: same outputs, no saving."
            if gate.gate_variant.top_k_skips
            else "The value gate's selection is a mask: it saves no compute."
        )
        items.append(
            f"`top_k={gate.top_k}` keeps, per token, the {gate.top_k} {units} with the largest gate values "
            f"and gives the others exact zeros. {saving}"
        )
    items.append(
        "The paper trained gates from scratch at scale. Its appendix reports that adding gates during "
        "continued training of a pretrained model neither removed existing attention sinks or massive "
        "activations nor changed final quality much; gains from fine-tuning a pretrained model with gates "
        "are not established."
    )
    return "\n".join(f"- {item}" for item in items)
