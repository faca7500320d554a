"""Recreate the final weights of a comparison's runs, which are not kept in git: retrain the runs whose
weights are missing with the results folder's saved config (same data, seed and budget) in a scratch folder,
check that each training loss curve equals the saved one (then the weights are the run's), and move the
weights into `<run>/model`.

    hf-gate-attention recipe summarization recreate results/reproduce [RUN ...]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from functools import partial
from pathlib import Path

from ...files import read_json
from ...offline import resolve_model
from ..common.run_dir import CONFIG_FILE, check_run_dir, claim_run_dir
from ..common.summaries.pipeline import load_data, train_all
from ..common.training import TRAIN_SUMMARY_FILE, load_tokenizer
from .config import RecipeConfig
from .models import train_run

# the largest relative difference of a step's training loss between a recreated run and the saved one that
# still counts as the same training (CPU kernels may reorder sums between machines)
LOSS_RTOL = 1e-4


def _losses(summary: dict) -> list[float]:
    return [entry["loss"] for entry in summary["log_history"] if "loss" in entry]


def missing_weights(results: Path, saved: dict) -> list[str]:
    """The runs of a results folder (its saved config `saved`) without final weights in `<run>/model`."""
    return [
        run["name"]
        for run in saved["runs"]
        if not (results / run["name"] / "model" / "config.json").is_file()
    ]


def recreate_weights(
    results: str | Path, scratch: str | Path, only: list[str] | None = None
) -> dict[str, float]:
    """Retrain the runs of `results` whose final weights are missing (of `only`, when given) and move the
    weights into place.

    Each run trains with the saved config into `<scratch>/<results name>/` (resumable: checkpoints there; a
    run trained there already is kept). Its per-step training losses must equal the saved
    `train_summary.json`'s within `LOSS_RTOL`, else `ValueError` and nothing is moved. Returns run -> the
    largest relative loss difference found.
    """
    results, scratch = Path(results), Path(scratch)
    saved = read_json(results / CONFIG_FILE)
    if saved is None:
        raise FileNotFoundError(f"{results} holds no {CONFIG_FILE}: not a results folder of the recipe")
    names = missing_weights(results, saved)
    unknown = sorted(set(only or ()) - {run["name"] for run in saved["runs"]})
    if unknown:
        raise ValueError(
            f"runs {unknown} are not in {results} ({', '.join(r['name'] for r in saved['runs'])})"
        )
    names = [name for name in names if only is None or name in only]
    if not names:
        return {}
    keys = {**saved, "output_dir": str(scratch), "name": results.name, "resume": True, "overwrite": False}
    config = RecipeConfig.from_dict(keys)  # every run: the scratch folder has the results folder's identity
    check_run_dir(config)
    claim_run_dir(config)
    for name in names:  # a run finished here whose weights were moved out before trains again, from scratch
        run_dir = config.run_dir / name
        if (run_dir / TRAIN_SUMMARY_FILE).is_file() and not (run_dir / "model").is_dir():
            shutil.rmtree(run_dir)
    model_path = resolve_model(config.model)
    missing = config.replace(runs=[run for run in config.runs if run.name in names])
    tokenizer = load_tokenizer(model_path)
    train_all(
        missing,
        tokenizer,
        load_data(config),
        partial(train_run, missing, model_path=model_path, tokenizer=tokenizer),
    )
    differences = {}
    for name in names:
        expected = _losses(read_json(results / name / TRAIN_SUMMARY_FILE))
        found = _losses(read_json(config.run_dir / name / TRAIN_SUMMARY_FILE))
        if len(found) != len(expected):
            raise ValueError(
                f"run {name}: recreated {len(found)} logged losses, the saved run {len(expected)}"
            )
        differences[name] = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(found, expected, strict=True))
    wrong = {name: diff for name, diff in differences.items() if diff > LOSS_RTOL}
    if wrong:
        raise ValueError(
            f"recreated runs trained differently from the saved ones (largest relative loss difference "
            f"{wrong}, allowed {LOSS_RTOL}): their weights would not be the runs' weights; nothing moved"
        )
    for name in names:
        (config.run_dir / name / "model").rename(results / name / "model")
    return differences


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=recreate_weights.__doc__)
    parser.add_argument("results", help="results folder of the summarization recipe (results/reproduce)")
    parser.add_argument("runs", nargs="*", metavar="RUN", help="only these runs (default: every run)")
    parser.add_argument("--scratch", default="logs/recreate", help="where the runs are retrained")
    args = parser.parse_args(argv)
    try:
        differences = recreate_weights(args.results, args.scratch, args.runs or None)
    except (ValueError, OSError) as err:
        print(f"recreate: error: {err}", file=sys.stderr)
        return 2
    for name, difference in differences.items():
        print(f"{name}: weights recreated (largest relative training-loss difference {difference:.2g})")
    if not differences:
        print(f"{args.results}: every requested run has its weights; nothing to recreate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
