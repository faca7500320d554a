"""ROUGE of a comparison's trained runs on the test documents cut at longer prompt lengths than they were
trained on (the article's claim is about long documents; the runs train on `doc_token_budget` tokens):

    hf-gate-attention recipe summarization lengths results/reproduce --tokens 2048 4096 [--runs RUN ...]

Each run's summaries of the same test papers, prompts cut (as in training, `truncation`) to each length, go
to `<results>/lengths/<tokens>/<run>/quality.json` and `predictions.jsonl` (resumable: a run evaluated there
is kept). `<results>/lengths.md` then holds ROUGE-L per length and run, the trained length first, with the
delta against the baseline at the same length (paired bootstrap CI) and the verdict on the +3.2 % claim.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ...claims import ROUGE_L_CLAIM_PERCENT, rouge_verdict
from ...files import atomic_write_json, atomic_write_text, read_json
from ...formatting import score_with_ci, signed, signed_percent, table
from ...offline import resolve_model
from ...sharing.loading import checkpoint_config
from ..common.run_dir import CONFIG_FILE
from ..common.summaries.generation import generation_prompts
from ..common.summaries.pipeline import QUALITY_FILE, evaluate_all, load_data
from ..common.summaries.report import rouge_deltas
from ..common.training import load_tokenizer
from .config import RecipeConfig
from .models import load_trained_model
from .recreate import missing_weights

LENGTHS_FOLDER = "lengths"
LENGTHS_REPORT = "lengths.md"
# length -> {"mean_prompt_tokens": of the test papers cut to it, "batch_size": summaries generated at a time}
SETUP_FILE = "setup.json"


def saved_config(results: Path) -> RecipeConfig:
    """The config a results folder was run with, its `run_dir` being `results` wherever that now is."""
    saved = read_json(results / CONFIG_FILE)
    if saved is None:
        raise FileNotFoundError(f"{results} holds no {CONFIG_FILE}: not a results folder of the recipe")
    return RecipeConfig.from_dict({**saved, "output_dir": str(results.parent), "name": results.name})


def _check_lengths(lengths: list[int], config: RecipeConfig, model_path: str) -> None:
    """`ValueError` for a length the model cannot read with the summary it writes after it."""
    model_config = checkpoint_config(model_path)
    positions = getattr(model_config, "max_position_embeddings", None)
    for length in lengths:
        if length <= 0:
            raise ValueError(f"--tokens {length}: a prompt length is a positive number of tokens")
        if length == config.doc_token_budget:
            raise ValueError(
                f"--tokens {length}: the runs' own length (doc_token_budget), evaluated with the recipe in "
                "each <run>/quality.json; pass longer lengths"
            )
        if positions is not None and length + config.max_new_tokens > positions:
            raise ValueError(
                f"--tokens {length}: the prompt and its {config.max_new_tokens} new tokens exceed the "
                f"model's {positions} positions; accepted: up to {positions - config.max_new_tokens}"
            )


def evaluate_lengths(
    results: str | Path, lengths: list[int], only: list[str] | None = None, batch_size: int | None = None
) -> Path:
    """Summaries and ROUGE of the trained runs of `results` (of `only`, when given) with the test prompts cut
    to each of `lengths` tokens, `batch_size` summaries at a time (default: the recipe's
    `generation_batch_size`; every run of a length takes the same), then `lengths.md`; returns its path.
    Every evaluated run needs its final weights (`recreate` retrains missing ones), and the baseline is
    evaluated with them."""
    results = Path(results)
    config = saved_config(results)
    names = [run.name for run in config.runs]
    unknown = sorted(set(only or ()) - set(names))
    if unknown:
        raise ValueError(f"runs {unknown} are not in {results} ({', '.join(names)})")
    baseline = config.baseline
    if baseline is None:
        raise ValueError(f"{results} has no baseline run (gate: null); the deltas compare against one")
    names = [name for name in names if only is None or name in only or name == baseline.name]
    missing = [name for name in missing_weights(results, config.to_dict()) if name in names]
    if missing:
        raise ValueError(
            f"runs {missing} have no final weights in {results}: first run "
            f"`hf-gate-attention recipe summarization recreate {results} {' '.join(missing)}`"
        )
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"--batch-size {batch_size}: summaries at a time is a positive number")
    batch_size = batch_size or config.generation_batch_size
    setup = read_json(results / LENGTHS_FOLDER / SETUP_FILE) or {}
    for length in lengths:
        done = sorted(
            path.parent.name for path in (results / LENGTHS_FOLDER / str(length)).glob("*/quality.json")
        )
        # (folders written before the batch size was recorded took the recipe's: the only one then)
        earlier = setup.get(str(length), {}).get("batch_size", config.generation_batch_size)
        if done and earlier != batch_size:
            raise ValueError(
                f"--tokens {length}: runs {done} were summarized {earlier} at a time, and every run of a "
                f"length takes the same batch size: pass --batch-size {earlier}, or delete "
                f"{results / LENGTHS_FOLDER / str(length)}"
            )
    model_path = resolve_model(config.model)
    _check_lengths(lengths, config, model_path)
    tokenizer = load_tokenizer(model_path)
    test_set = load_data(config.replace(eval_steps=None))["test"]
    runs = {run.name: run for run in config.runs}
    for length, batch in [
        (config.doc_token_budget, config.generation_batch_size),
        *((n, batch_size) for n in lengths),
    ]:
        prompts = generation_prompts(test_set, tokenizer, config.replace(doc_token_budget=length))
        setup[str(length)] = {
            "mean_prompt_tokens": sum(map(len, prompts)) / len(prompts),
            "batch_size": batch,
        }
    atomic_write_json(results / LENGTHS_FOLDER / SETUP_FILE, setup)
    for length in lengths:
        at_length = config.replace(
            doc_token_budget=length,
            generation_batch_size=batch_size,
            output_dir=str(results / LENGTHS_FOLDER),
            name=str(length),
        )
        evaluate_all(
            at_length,
            names,
            lambda name: load_trained_model(config, runs[name], model_path),
            tokenizer,
            test_set,
        )
    report = results / LENGTHS_REPORT
    atomic_write_text(report, lengths_report(results))
    return report


def length_rows(results: Path) -> list[dict]:
    """One row per evaluated length and run, the trained length (the results folder's own `quality.json`)
    first: `length`, `run`, `rouge_l` (`{mean, low, high}`), `delta` (ROUGE-L vs the baseline at that
    length, `None` for the baseline or where it was not evaluated), `verdict`, `prompt_tokens` (mean) and
    `batch_size` (`None` where not recorded), `examples`."""
    config = saved_config(results)
    lengths = sorted(
        int(folder.name) for folder in (results / LENGTHS_FOLDER).glob("*") if folder.name.isdigit()
    )
    folders = {config.doc_token_budget: results} | {
        length: results / LENGTHS_FOLDER / str(length)
        for length in lengths
        if length != config.doc_token_budget
    }
    setup = read_json(results / LENGTHS_FOLDER / SETUP_FILE) or {}
    rows = []
    for length, folder in folders.items():
        quality = {run.name: read_json(folder / run.name / QUALITY_FILE) for run in config.runs}
        base = quality.get(config.baseline.name) if config.baseline else None
        for name, found in quality.items():
            if found is None:
                continue
            delta = None
            if base is not None and found is not base:
                delta = rouge_deltas(found, base, config.n_bootstrap, config.confidence, config.seed)[
                    "rougeL"
                ]
            rows.append(
                {
                    "length": length,
                    "run": name,
                    "rouge_l": found["rouge"]["rougeL"],
                    "delta": delta,
                    "verdict": "" if delta is None else rouge_verdict(delta, base["rouge"]["rougeL"]["mean"]),
                    "prompt_tokens": setup.get(str(length), {}).get("mean_prompt_tokens"),
                    "batch_size": setup.get(str(length), {}).get("batch_size"),
                    "examples": found["num_examples"],
                }
            )
    return rows


def lengths_table(rows: list[dict]) -> str:
    """Markdown table of `length_rows`."""
    cells = [
        [
            f"{row['length']:,}",
            "-" if row["prompt_tokens"] is None else f"{row['prompt_tokens']:,.0f}",
            "-" if row["batch_size"] is None else str(row["batch_size"]),
            row["run"],
            score_with_ci(row["rouge_l"]),
            "-"
            if row["delta"] is None
            else f"{signed(row['delta']['delta'])} [{signed(row['delta']['low'])}, "
            f"{signed(row['delta']['high'])}] ({signed_percent(row['delta']['percent'])})",
            row["verdict"],
        ]
        for row in rows
    ]
    header = [
        "prompt tokens (at most)",
        "mean prompt tokens",
        "batch",
        "run",
        "ROUGE-L [CI]",
        "vs baseline [CI]",
    ]
    return table([*header, f"+{ROUGE_L_CLAIM_PERCENT} % claim"], cells)


def lengths_report(results: Path) -> str:
    """`lengths.md`: the table of `length_rows` with its setup."""
    config = saved_config(results)
    rows = length_rows(results)
    examples = sorted({row["examples"] for row in rows})
    return "\n".join(
        [
            "# ROUGE-L of the trained runs at longer document lengths",
            "",
            f"Written by `hf-gate-attention recipe summarization lengths {results} --tokens ...`. The runs "
            f"were trained on prompts of at most {config.doc_token_budget} tokens; here the same "
            f"{'/'.join(map(str, examples))} test papers of `{config.dataset}` are cut "
            f"(`{config.truncation}`) to each length and summarized greedily "
            f"({config.max_new_tokens} new tokens at most), `batch` summaries at a time (prompts left-padded "
            "to the longest of the batch). ROUGE-L x100 with its "
            f"{100 * config.confidence:g} % bootstrap CI; deltas against the baseline at the same length, "
            "paired by paper; verdicts by the rule of REPRODUCTION.md.",
            "",
            lengths_table(rows),
            "",
        ]
    )


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=evaluate_lengths.__doc__)
    parser.add_argument("results", help="results folder of the summarization recipe (results/reproduce)")
    parser.add_argument(
        "--tokens", type=int, nargs="+", required=True, metavar="N", help="prompt lengths, e.g. 2048 4096"
    )
    parser.add_argument("--runs", nargs="+", metavar="RUN", help="only these runs (and the baseline)")
    parser.add_argument(
        "--batch-size", type=int, metavar="N", help="summaries at a time (default: generation_batch_size)"
    )
    args = parser.parse_args(argv)
    try:
        report = evaluate_lengths(args.results, args.tokens, args.runs, args.batch_size)
    except (ValueError, OSError) as err:
        print(f"lengths: error: {err}", file=sys.stderr)
        return 2
    print(report.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
