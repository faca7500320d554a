"""The article's speed claim (+18 % inference speed) judged where it is made: summaries of long documents.

One summary = the prefill of a `--lengths`-token document (KV cache on, last logits only) and `--new-tokens`
single-token decode steps on that cache, as `generate` runs them (batch 1, DynamicCache), for each case:
the ungated SmolLM2-135M-Instruct, the dense gates of the reproduction (`output` headwise and elementwise,
`qk` headwise) and its sparse runs that keep quality (top-2 / top-1 of 3 key/value groups whose dropped
groups read a sink of 4 and a window of 64 keys), all on backend `torch` (`benchmarks/decode.py`'s cases,
`init="paper"`). The token ids are random, and so are the gates: they keep the runs' number of groups per
token, which fixes the work of decode; prefill skips rows per group (`core/sparse.py`), so there the work also
depends on how the kept rows spread over the groups, and untrained gates spread them at random (the
reproduction's trained gates keep some groups for nearly every token and drop others for nearly every token;
their weights are not in git).

Per length, every case runs once per round in an order rotated from round to round, after an untimed
warm-up round (`harness.py`); ratios are medians over rounds of (case / ungated of the same round), with the
range of the rounds. The verdict is `results/REPRODUCTION.md`'s rule: *reproduced* when every round is at
least x1.18 faster per summary than ungated, *not reproduced* when no round is, *inconclusive* otherwise.
Sparse runs are also compared with the dense headwise gate (the same gate without top-k). A profile of one
summary per phase at the longest length says where the time goes (self CPU time of the top aten ops).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/long_document.py --out benchmarks/results/long_document

With `--trained results/reproduce` the cases are instead the reproduction's trained runs whose weights are
in `<run>/model` (not in git: `hf-gate-attention recipe summarization recreate results/reproduce [RUN ...]`
retrains them, checked against the saved loss curves), each loaded as the recipe loads it for its own speed
rows; the first ungated run is the reference and the first dense gated run the "dense" one:

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/long_document.py --trained results/reproduce \
        --out benchmarks/results/long_document_trained

Random ids leave a trained gate nothing to read, and its choices (which groups a token keeps, so what sparse
prefill skips) come from what it reads: with `--real-text` each length's document is instead the longest of
the results folder's test papers, prompted as the recipe prompts it within that many tokens (the paper cut
as in training; a length no paper fills gets the longest whole paper, and the rows say its tokens):

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/long_document.py --trained results/reproduce --real-text \
        --lengths 1024 2048 4096 8064 --out benchmarks/results/long_document_trained_text

Run it on an otherwise idle machine (about 25 min on 2 cores at the default lengths).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from collections import Counter
from pathlib import Path

import torch
import transformers
from decode import BASELINE, Bench
from harness import (
    command_line,
    cpu_model,
    markdown_page,
    markdown_table,
    median_range,
    ratios,
    write_results,
)
from overhead import load_model

from hf_gate_attention.claims import SPEEDUP_CLAIM as CLAIM
from hf_gate_attention.claims import speed_verdict
from hf_gate_attention.offline import resolve_model
from hf_gate_attention.recipes.common.summaries.generation import generation_prompts
from hf_gate_attention.recipes.common.summaries.pipeline import load_data
from hf_gate_attention.recipes.common.training import load_tokenizer
from hf_gate_attention.recipes.summarization.lengths import saved_config
from hf_gate_attention.recipes.summarization.models import load_trained_model

DENSE = "output/headwise"
CASES = [
    BASELINE,
    DENSE,
    "output/elementwise",
    "qk/headwise",
    "top-2 of 3, sink 4 + window 64",
    "top-1 of 3, sink 4 + window 64",
]


class PatchedCases(Bench):
    """`CASES` on one model, patched for each with untrained gates (`decode.Bench`)."""

    cases, baseline, dense = CASES, BASELINE, DENSE


class TrainedRuns:
    """The runs of a summarization results folder whose weights are in `<run>/model`, one model each, with
    what `measure_length` asks of `PatchedCases`: `cases`, `baseline`, `dense`, `tokens`, `set_case` and
    `model`. `names`: only these runs."""

    def __init__(
        self, results: str | Path, names: list[str] | None = None, seed: int = 0, real_text: bool = False
    ):
        results = Path(results)
        try:
            config = saved_config(results)
        except FileNotFoundError as err:
            raise SystemExit(f"--trained: {err}") from None
        runs = [
            run
            for run in config.runs
            if (results / run.name / "model").is_dir() and (names is None or run.name in names)
        ]
        ungated = [run.name for run in runs if run.is_baseline]
        dense = [run.name for run in runs if not run.is_baseline and run.gate.top_k is None]
        if not ungated:
            raise SystemExit(
                f"--trained {results}: no ungated run with weights in <run>/model among "
                f"{', '.join(run.name for run in runs) or 'none'}; recreate them with `hf-gate-attention "
                f"recipe summarization recreate {results} RUN ...`"
            )
        model_path = resolve_model(config.model)
        self.models = {run.name: load_trained_model(config, run, model_path) for run in runs}
        self.cases = list(self.models)
        self.baseline, self.dense = ungated[0], (dense or ungated)[0]
        self.model = self.models[self.baseline]
        self.generator = torch.Generator().manual_seed(seed)
        self.config, self.tokenizer, self.test_set = config, None, None
        if real_text:
            self.tokenizer = load_tokenizer(model_path)
            self.test_set = load_data(config.replace(eval_steps=None))["test"]

    def tokens(self, length: int) -> torch.Tensor:
        """`(1, L)` ids: random ids of the model's vocabulary, L = `length` (from `self.generator`), or with
        `real_text` the longest of the test papers' prompts built as the recipe builds them within `length`
        tokens (L = `length` where a paper fills it, the papers cut as in training)."""
        if self.test_set is None:
            return Bench.tokens(self, length)
        config = self.config.replace(doc_token_budget=length)
        prompts = generation_prompts(self.test_set, self.tokenizer, config)
        return torch.tensor([max(prompts, key=len)])

    def set_case(self, case: str) -> None:
        self.model = self.models[case]


@torch.no_grad()
def summary(model, document: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    """(prefill seconds, decode seconds) of one summary of `document (1, L)` by `model`."""
    model.eval()
    cache = transformers.DynamicCache(config=model.config)
    start = time.perf_counter()
    logits = model(input_ids=document, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
    prefill = time.perf_counter() - start
    token = logits[:, -1:].argmax(-1)
    start = time.perf_counter()
    for _ in range(new_tokens):
        token = model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
    return prefill, time.perf_counter() - start


def measure_length(bench: PatchedCases | TrainedRuns, length: int, args) -> list[dict]:
    document = bench.tokens(length)
    cases, baseline, dense = bench.cases, bench.baseline, bench.dense
    times = {case: [] for case in cases}
    for index in range(args.rounds + 1):  # round 0: warm-up, untimed
        shift = index % len(cases)
        for case in cases[shift:] + cases[:shift]:
            bench.set_case(case)
            prefill, decode = summary(bench.model, document, args.new_tokens)
            if index:
                times[case].append((prefill, decode))
        if index:
            done = ", ".join(f"{case} {sum(times[case][-1]):.2f} s" for case in cases)
            print(f"{length} tokens, round {index}/{args.rounds}: {done}", flush=True)
    bench.set_case(baseline)
    rows = []
    for case in cases:
        total = [sum(pair) for pair in times[case]]
        speedups = [1 / ratio for ratio in ratios(total, [sum(pair) for pair in times[baseline]])]
        speedup, low, high = median_range(speedups)
        versus_dense = median_range([1 / r for r in ratios(total, [sum(p) for p in times[dense]])])
        phase_ratio = {
            phase: median_range(ratios([p[i] for p in times[case]], [p[i] for p in times[baseline]]))[0]
            for i, phase in enumerate(("prefill", "decode"))
        }
        rows.append(
            {
                "length": length,
                "prompt_tokens": document.shape[1],
                "case": case,
                "prefill_s": statistics.median(p[0] for p in times[case]),
                "decode_s": statistics.median(p[1] for p in times[case]),
                "summary_s": statistics.median(total),
                "prefill_time_ratio": phase_ratio["prefill"],
                "decode_time_ratio": phase_ratio["decode"],
                "speedup": speedup,
                "speedup_low": low,
                "speedup_high": high,
                "speedup_vs_dense": versus_dense[0],
                "speedup_vs_dense_low": versus_dense[1],
                "speedup_vs_dense_high": versus_dense[2],
                "verdict": speed_verdict(speedups),
                "rounds": len(total),
            }
        )
    return rows


def profile_phases(
    bench: PatchedCases | TrainedRuns, length: int, new_tokens: int, top: int = 6
) -> list[dict]:
    """Self CPU time of the top aten ops of one summary per phase, for the ungated, dense and last cases."""
    rows = []
    document = bench.tokens(length)
    for case in dict.fromkeys((bench.baseline, bench.dense, bench.cases[-1])):
        bench.set_case(case)
        with torch.no_grad():
            cache = transformers.DynamicCache(config=bench.model.config)
            for phase in ("prefill", "decode"):
                with torch.profiler.profile() as profile:
                    steps = [document] if phase == "prefill" else [document[:, -1:]] * new_tokens
                    for ids in steps:
                        bench.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
                spent = Counter()
                for event in profile.key_averages():
                    if event.key.startswith("aten::"):
                        spent[event.key] += event.self_cpu_time_total
                total = sum(spent.values())
                for name, micros in spent.most_common(top):
                    rows.append({"case": case, "phase": phase, "op": name, "share": micros / total})
    bench.set_case(bench.baseline)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--new-tokens", type=int, default=48, help="decoded tokens per summary")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per length, after a warm-up")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads")
    parser.add_argument("--trained", help="a results folder of the recipe: its trained runs are the cases")
    parser.add_argument("--runs", nargs="+", help="with --trained: only these runs")
    parser.add_argument(
        "--real-text",
        action="store_true",
        help="with --trained: each length's document is the longest test paper's prompt, not random ids",
    )
    parser.add_argument("--out", default="benchmarks/results/long_document", help="writes <out>.csv/.md")
    args = parser.parse_args()
    if args.real_text and not args.trained:
        parser.error("--real-text needs --trained (the test papers of a results folder)")
    torch.set_num_threads(args.threads)
    if args.trained:
        bench = TrainedRuns(args.trained, args.runs, real_text=args.real_text)
        documents = "the longest test paper's prompt" if args.real_text else "random token ids"
        what = f"the trained runs of {args.trained} (their gates as trained) on {documents}"
    else:
        bench = PatchedCases(load_model(resolve_model("SmolLM2-135M-Instruct")))
        what = "SmolLM2-135M-Instruct float32, untrained gates, random token ids"
    rows = [row for length in args.lengths for row in measure_length(bench, length, args)]
    profile = profile_phases(bench, max(args.lengths), args.new_tokens)
    header = (
        f"`{command_line()}` on {datetime.date.today()}: {what}, backend 'torch', "
        f"batch 1, one summary = prefill of the document + {args.new_tokens} decoded tokens; {args.rounds} "
        f"interleaved rounds after a warm-up round; {cpu_model()}, {args.threads} threads; torch "
        f"{torch.__version__}, transformers {transformers.__version__}. Speed-up: ungated seconds per "
        f"summary / case's, median over rounds [lowest, highest round]. Claim: x{CLAIM} (+18 %), judged by "
        "results/REPRODUCTION.md's rule (every round at least x1.18: reproduced; none: not reproduced)."
    )
    columns = ["document tokens", "prompt tokens", "case", "prefill s", "decode s", "s / summary"]
    columns += ["prefill ratio", "decode ratio", "speed-up [rounds]", f"vs {bench.dense} [rounds]"]
    columns += ["+18 % claim"]
    cells = [
        [
            f"{r['length']:,}",
            f"{r['prompt_tokens']:,}",
            r["case"],
            f"{r['prefill_s']:.2f}",
            f"{r['decode_s']:.2f}",
            f"{r['summary_s']:.2f}",
            f"x{r['prefill_time_ratio']:.3f}",
            f"x{r['decode_time_ratio']:.3f}",
            f"x{r['speedup']:.3f} [{r['speedup_low']:.3f}, {r['speedup_high']:.3f}]",
            f"x{r['speedup_vs_dense']:.3f} "
            f"[{r['speedup_vs_dense_low']:.3f}, {r['speedup_vs_dense_high']:.3f}]",
            "" if r["case"] == bench.baseline else r["verdict"],
        ]
        for r in rows
    ]
    table = markdown_table(columns, cells, "rrlrrrrrlll")
    profile_cells = [[r["case"], r["phase"], r["op"], f"{100 * r['share']:.1f} %"] for r in profile]
    where = markdown_table(["case", "phase", "aten op", "share of aten self time"], profile_cells, "lllr")
    lines = [
        *table,
        "",
        "Ratios: case time / ungated time of the same round (prefill and decode apart); below 1 is faster.",
        "",
        f"## Where the time goes ({max(args.lengths):,}-token document, one summary)",
        "",
        *where,
    ]
    write_results(args.out, rows + profile, markdown_page(header, lines))


if __name__ == "__main__":
    main()
