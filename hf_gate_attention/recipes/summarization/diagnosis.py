"""Diagnostics of a comparison's models: the pretrained (ungated) model and every run whose final weights are
in the results folder, on the same test documents, with the paper appendix's prediction beside the numbers.

    hf-gate-attention recipe summarization diagnosis results/reproduce --out results/diagnostics

(also `python -m hf_gate_attention.recipes.summarization.diagnosis ...`, the command DIAGNOSTICS.md names)

Final weights are not kept in git. `--recreate-missing` first retrains the runs whose weights are missing
(`recreate.recreate_weights`: the saved config, checked against the saved loss curves).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from ...diagnostics import diagnose, text_inputs
from ...diagnostics.measure import summarize
from ...diagnostics.report import plot_layers, summary_table, write_diagnosis
from ...files import atomic_write_text, read_json
from ...formatting import gate_label
from ...offline import resolve_model
from ...sharing.loading import load_model
from ..common.run_dir import CONFIG_FILE
from ..common.summaries.data import load_summarization_dataset
from ..common.training import load_tokenizer
from .recreate import missing_weights, recreate_weights

MODULE = "hf_gate_attention.recipes.summarization.diagnosis"

PRETRAINED = "pretrained"
APPENDIX = (
    "Qiu et al. 2025, appendix: adding the gate to an already trained model and training on neither removes "
    "the attention sink and massive activations already present nor changes the final performance much; "
    "they form during pretraining."
)


def diagnose_comparison(
    results: str | Path, out: str | Path, max_inputs: int = 8, max_length: int = 512, prog: str | None = None
) -> str:
    """Diagnose the pretrained model and the runs of `results` found with weights; write per-model files,
    `layers.png` and `DIAGNOSTICS.md` into `out` (naming the command `prog`, default `python -m` of this
    module); returns the Markdown."""
    results, out = Path(results), Path(out)
    prog = prog or f"python -m {MODULE}"
    saved = read_json(results / CONFIG_FILE)
    if saved is None:
        raise FileNotFoundError(f"{results} holds no {CONFIG_FILE}: not a results folder of the recipe")
    model_path = resolve_model(saved["model"])
    data = load_summarization_dataset(
        saved["dataset"], saved.get("document_column"), saved.get("summary_column"), splits=["test"]
    )
    inputs = text_inputs(load_tokenizer(model_path), data["test"]["document"][:max_inputs], max_length)
    missing = missing_weights(results, saved)
    folders = {PRETRAINED: model_path}
    folders |= {
        r["name"]: str(results / r["name"] / "model") for r in saved["runs"] if r["name"] not in missing
    }
    diagnoses = {}
    for label, folder in folders.items():
        model = load_model(folder, backend="torch", dtype=torch.float32, attn_implementation="sdpa")
        diagnoses[label] = diagnose(model, inputs, progress=True)
        write_diagnosis(diagnoses[label], out / label, title=label)
        del model
    # runs without weights here whose diagnosis on as many inputs an earlier run of this command left in `out`
    earlier = {name: read_json(out / name / "diagnostics.json") for name in missing}
    earlier = {k: v for k, v in earlier.items() if v is not None and v["inputs"]["count"] == len(inputs)}
    order = [PRETRAINED, *(run["name"] for run in saved["runs"])]
    diagnoses = {label: (diagnoses | earlier)[label] for label in order if label in diagnoses | earlier}
    plot_layers(diagnoses, out / "layers.png")
    gates = {run["name"]: gate_label(run["gate"]) for run in saved["runs"]}
    rows = [
        f"| {label} | {gates.get(label, 'none (not fine-tuned)')}"
        + (
            " (diagnosed by an earlier run of this command; its weights are not here)"
            if label in earlier
            else ""
        )
        + f" | [heatmaps]({label}/heatmaps.png), [layers]({label}/layers.png) |"
        for label in diagnoses
    ]
    missing = [name for name in missing if name not in earlier]
    text = "\n".join(
        [
            f"# Diagnostics of `{results}`",
            "",
            f"Produced by `{prog} {results} --out {out}`: "
            f"{len(inputs)} test documents of `{saved['dataset']}`, each its first {max_length} tokens, SDPA "
            "attention, float32. First-token attn and top-1 attn: mean over layers, heads and query "
            "positions "
            ">= 4 of the softmax weight on token 0 and of the largest weight (before any gate).",
            "",
            summary_table({label: summarize(d) for label, d in diagnoses.items()}),
            "",
            "| model | gate | plots |",
            "|---|---|---|",
            *rows,
            "",
            "![per layer](layers.png)",
            "",
            f"Prediction: {APPENDIX}",
            "",
            (
                f"Not diagnosed (no final weights in `{results}`; `--recreate-missing` retrains them): "
                + ", ".join(missing)
                if missing
                else "Every run was diagnosed."
            ),
            "",
        ]
    )
    atomic_write_text(out / "DIAGNOSTICS.md", text)
    return text


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=diagnose_comparison.__doc__)
    parser.add_argument("results", help="results folder of the summarization recipe (results/reproduce)")
    parser.add_argument("--out", required=True, help="folder for the diagnostics and DIAGNOSTICS.md")
    parser.add_argument("--max-inputs", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument(
        "--recreate-missing",
        nargs="*",
        metavar="RUN",
        help="retrain the runs whose final weights are missing first (only the named RUNs, if any; same "
        "config; checked against the saved loss curves; resumable)",
    )
    parser.add_argument("--scratch", default="logs/recreate", help="where --recreate-missing trains")
    args = parser.parse_args(argv)
    try:
        if args.recreate_missing is not None:
            only = args.recreate_missing or None
            for name, difference in recreate_weights(args.results, args.scratch, only).items():
                print(
                    f"{name}: weights recreated (largest relative training-loss difference {difference:.2g})"
                )
        print(diagnose_comparison(args.results, args.out, args.max_inputs, args.max_length, prog))
    except (ValueError, OSError) as err:
        print(f"diagnosis: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
