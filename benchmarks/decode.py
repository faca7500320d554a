"""Speed of gated vs ungated SmolLM2-135M-Instruct on CPU: decode at long context, prefill, one training step.

Phases (batch 1, `--dtype` (float32 by default), gates `init="paper"` so that none is a trivial no-op, run by
`--backend` (`torch` by default; `auto` times what `patch` chooses)):

- `decode`: tokens/s of `--decode-steps` single-token forwards on a KV cache of `--contexts` tokens (default
  1,024 / 4,096 / 8,192), as `generate` runs them, with each of `--caches`: `dynamic` (transformers'
  `DynamicCache`, `generate`'s default: every step concatenates the new keys and values to the whole cache)
  and `static` (`StaticCache`, `generate(..., cache_implementation="static")`: written in place);
- `prefill`: one no-grad forward of `--prefill-len` tokens (KV cache on, last logits only);
- `train`: one step, forward + backward + `AdamW.step()` + `zero_grad`, on `--train-len` tokens.

Cases: the ungated baseline, dense gates (output/headwise, output/elementwise, qk/headwise, qk/elementwise)
and sparse top-k over key/value groups (SmolLM2 has 3; `top_k_unit="kv_group"`, keeping all 3, 2 or 1: keeping
all 3 runs the sparse path with nothing to skip). One model instance is patched and unpatched between
measurements (`--patch-once`: a copy per case, patched once, for prefill and decode). Decode: the context is
prefilled once per cache and context length by the ungated model and every case decodes from that same cache,
cropped back after each measurement (timing does not depend on the cached values; each case computes its own
gates and selection from its own inputs). Each round times every case once, in an order rotated from round to
round to cancel drift, after an untimed warm-up round; a case's ratio is the median over rounds of (case time
/ baseline time of the same round), reported with the range of the rounds.

Run it on an otherwise idle machine. Example:

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/decode.py              # writes benchmarks/results/decode.*
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/decode.py --contexts 256 --rounds 2 --out /tmp/quick
"""

from __future__ import annotations

import argparse
import copy
import datetime
import statistics
import time
from pathlib import Path

import torch
import transformers
from harness import (
    command_line,
    cpu_model,
    interleaved,
    markdown_page,
    markdown_table,
    median_range,
    ratios,
    write_results,
)
from overhead import load_model
from transformers import DynamicCache, StaticCache

from hf_gate_attention import GateConfig, gate_parameters, patch, unpatch
from hf_gate_attention.core import sparse as sparse_module
from hf_gate_attention.offline import resolve_model

BASELINE = "ungated"
CASES = {
    BASELINE: None,
    "output/headwise": {"variant": "output", "granularity": "headwise"},
    "output/elementwise": {"variant": "output", "granularity": "elementwise"},
    "qk/headwise": {"variant": "qk", "granularity": "headwise"},
    "qk/elementwise": {"variant": "qk", "granularity": "elementwise"},
    "top-3 of 3 kv groups": {"variant": "output", "top_k": 3, "top_k_unit": "kv_group"},
    "top-2 of 3 kv groups": {"variant": "output", "top_k": 2, "top_k_unit": "kv_group"},
    "top-1 of 3 kv groups": {"variant": "output", "top_k": 1, "top_k_unit": "kv_group"},
    # dropped groups read their 4 first and 64 last keys (GateConfig.top_k_sink / top_k_window)
    "top-2 of 3, sink 4 + window 64": {
        "variant": "output",
        "top_k": 2,
        "top_k_unit": "kv_group",
        "top_k_sink": 4,
        "top_k_window": 64,
    },
    "top-1 of 3, sink 4 + window 64": {
        "variant": "output",
        "top_k": 1,
        "top_k_unit": "kv_group",
        "top_k_sink": 4,
        "top_k_window": 64,
    },
}
# the two ways a single sequence's decode step with sink and window reads can run (`sparse.SKIP_DECODE`;
# the other cases run the default, skipping)
SKIP_DECODE = {
    f"top-{kept} of 3, sink 4 + window 64, {way}": skip
    for kept in (2, 1)
    for way, skip in (("skipping", True), ("one masked call", False))
}
CASES.update({case: CASES[case.rsplit(", ", 1)[0]] for case in SKIP_DECODE})
PHASES = ("decode", "prefill", "train")
CACHES = ("dynamic", "static")


class Bench:
    """One model and its optimizer; times one phase call of one case (the model patched for it)."""

    def __init__(self, model, backend: str = "torch", seed: int = 0):
        self.model, self.backend = model, backend
        self.generator = torch.Generator().manual_seed(seed)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def tokens(self, length: int) -> torch.Tensor:
        return torch.randint(self.model.config.vocab_size, (1, length), generator=self.generator)

    def set_case(self, case: str) -> None:
        if len(self.optimizer.param_groups) > 1:
            for param in self.optimizer.param_groups.pop()["params"]:
                self.optimizer.state.pop(param, None)
            unpatch(self.model)
        sparse_module.SKIP_DECODE = SKIP_DECODE.get(case, True)
        if CASES[case] is not None:
            torch.manual_seed(0)
            patch(self.model, GateConfig(init="paper", **CASES[case]), backend=self.backend)
            self.optimizer.add_param_group({"params": list(gate_parameters(self.model))})

    @torch.no_grad()
    def prefill_cache(self, kind: str, context: int, steps: int):
        """A `kind` cache holding `context` tokens (room for `steps` more when static)."""
        self.set_case(BASELINE)
        self.model.eval()
        config = self.model.config
        if kind == "static":
            cache = StaticCache(config=config, max_cache_len=context + steps)
        else:
            cache = DynamicCache(config=config)
        self.model(input_ids=self.tokens(context), past_key_values=cache, use_cache=True, logits_to_keep=1)
        return cache

    @torch.no_grad()
    def decode(self, cache, steps: int) -> float:
        """Seconds for `steps` single-token forwards on `cache`, which is cropped back afterwards."""
        self.model.eval()
        token = self.tokens(1)
        start = time.perf_counter()
        for _ in range(steps):
            self.model(input_ids=token, past_key_values=cache, use_cache=True)
        elapsed = time.perf_counter() - start
        cache.crop(-steps)
        return elapsed

    def prefill(self, input_ids: torch.Tensor) -> float:
        self.model.eval()
        start = time.perf_counter()
        with torch.no_grad():
            self.model(input_ids=input_ids, use_cache=True, logits_to_keep=1)
        return time.perf_counter() - start

    def train_step(self, input_ids: torch.Tensor) -> float:
        self.model.train()
        start = time.perf_counter()
        self.model(input_ids=input_ids, labels=input_ids).loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start


class PatchedOnce(Bench):
    """`--patch-once`: a copy of the model per case, patched once before the rounds, instead of the one model
    patched again (new gate weights) before every measurement; prefill and decode only (no optimizer)."""

    def __init__(self, model, backend: str = "torch", seed: int = 0):
        self.base, self.model, self.backend = model, model, backend
        self.generator = torch.Generator().manual_seed(seed)
        self.copies = {BASELINE: model}

    def set_case(self, case: str) -> None:
        sparse_module.SKIP_DECODE = SKIP_DECODE.get(case, True)
        if case not in self.copies:
            torch.manual_seed(0)
            gate = GateConfig(init="paper", **CASES[case])
            self.copies[case] = patch(copy.deepcopy(self.base), gate, backend=self.backend)
        self.model = self.copies[case]


def rows_of(phase: str, size: int, times: dict[str, list[float]], work: int) -> list[dict]:
    """One row per case: medians, tokens/s (`work` tokens per call), per-round ratios to the baseline."""
    rows = []
    for case, seconds in times.items():
        ratio, ratio_min, ratio_max = median_range(ratios(seconds, times[BASELINE]))
        rows.append(
            {
                "phase": phase,
                "tokens": size,
                "case": case,
                "median_s": statistics.median(seconds),
                "tokens_per_s": work / statistics.median(seconds),
                "time_ratio": ratio,
                "ratio_min": ratio_min,
                "ratio_max": ratio_max,
                "rounds": len(seconds),
            }
        )
    return rows


def timed_rounds(run, cases: list[str], rounds: int, label: str) -> dict[str, list[float]]:
    """`run(case) -> seconds` of every case in interleaved rounds, each round printed."""

    def report(index, times):
        print(f"{label} round {index + 1}/{rounds}: " + ", ".join(f"{c} {times[c][-1]:.3f} s" for c in cases))

    return interleaved(run, cases, rounds, on_round=report)


def measure(bench: Bench, args) -> list[dict]:
    rows = []
    cases = args.cases
    if "decode" in args.phases:
        for kind in args.caches:
            for context in args.contexts:
                cache = bench.prefill_cache(kind, context, args.decode_steps)

                def run(case, cache=cache):
                    bench.set_case(case)
                    return bench.decode(cache, args.decode_steps)

                times = timed_rounds(run, cases, args.rounds, f"decode {kind} {context}")
                rows += rows_of(f"decode ({kind} cache)", context, times, args.decode_steps)
                del cache
    for phase, length, call in (
        ("prefill", args.prefill_len, bench.prefill),
        ("train", args.train_len, bench.train_step),
    ):
        if phase in args.phases:
            input_ids = bench.tokens(length)

            def run(case, call=call, input_ids=input_ids):
                bench.set_case(case)
                return call(input_ids)

            rows += rows_of(phase, length, timed_rounds(run, cases, args.rounds, phase), length)
    bench.set_case(BASELINE)
    return rows


def markdown(rows: list[dict], header: str) -> str:
    columns = ["phase", "tokens", "case", "median s", "tokens/s"]
    columns += ["time ratio vs ungated (median, range of rounds)", "speed-up"]
    cells = [
        [
            r["phase"],
            f"{r['tokens']:,}",
            r["case"],
            f"{r['median_s']:.3f}",
            f"{r['tokens_per_s']:.1f}",
            f"x{r['time_ratio']:.3f} (x{r['ratio_min']:.3f} to x{r['ratio_max']:.3f})",
            f"x{1 / r['time_ratio']:.3f}",
        ]
        for r in rows
    ]
    return markdown_page(header, markdown_table(columns, cells, "lrlrrlr"))


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = list(dict.fromkeys(r["phase"] for r in rows if r["phase"].startswith("decode")))
    if not phases:
        return
    figure, panels = plt.subplots(1, len(phases), figsize=(6 * len(phases), 4.5), squeeze=False)
    for phase, axes in zip(phases, panels[0], strict=True):
        decode = [r for r in rows if r["phase"] == phase]
        for case in dict.fromkeys(r["case"] for r in decode):
            points = [r for r in decode if r["case"] == case]
            speeds = [r["tokens_per_s"] for r in points]
            axes.plot([r["tokens"] for r in points], speeds, marker="o", label=case)
        axes.set_xscale("log", base=2)
        axes.set_xlabel("context (tokens)")
        axes.set_ylabel("decode tokens/s (median of rounds)")
        axes.set_title(f"{title}\n{phase}", fontsize=9)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    figure.tight_layout()
    temporary = path.with_name(f".{path.name}.tmp.png")
    figure.savefig(temporary, dpi=120)
    plt.close(figure)
    temporary.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 8192], help="decode contexts")
    parser.add_argument("--decode-steps", type=int, default=8, help="decoded tokens per measurement")
    parser.add_argument("--prefill-len", type=int, default=2048, help="tokens of the prefill phase")
    parser.add_argument("--train-len", type=int, default=512, help="tokens of the training step")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per phase, after a warm-up")
    parser.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES), help="what to time")
    parser.add_argument("--caches", nargs="+", choices=CACHES, default=list(CACHES), help="decode caches")
    parser.add_argument(
        "--cases", nargs="+", choices=list(CASES), default=list(CASES), metavar="CASE", help=", ".join(CASES)
    )
    parser.add_argument(
        "--model", default="SmolLM2-135M-Instruct", help="local folder, Hub id or offline name"
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="model dtype")
    parser.add_argument(
        "--backend", default="torch", help="what runs the gates (as in patch; auto: its choice)"
    )
    parser.add_argument(
        "--patch-once", action="store_true", help="a patched copy per case (prefill and decode phases only)"
    )
    parser.add_argument("--out", default="benchmarks/results/decode", help="writes <out>.csv/.md/.png")
    args = parser.parse_args()
    if args.patch_once and "train" in args.phases:
        parser.error("--patch-once times prefill and decode only: pass --phases prefill and/or decode")
    if BASELINE not in args.cases:
        args.cases = [BASELINE, *args.cases]

    torch.set_num_threads(args.threads)
    model = load_model(resolve_model(args.model)).to(getattr(torch, args.dtype))
    rows = measure((PatchedOnce if args.patch_once else Bench)(model, args.backend), args)
    cpu = f"{cpu_model()}, {args.threads} threads"
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    command = command_line()
    for row in rows:
        row.update(decode_steps=args.decode_steps, dtype=args.dtype, backend=args.backend, **versions)
        row.update(cpu=cpu, command=command)
    header = (
        f"`{command}` on {datetime.date.today()}: {args.model} {args.dtype}, gates on backend "
        f"{args.backend!r}, batch 1, {args.rounds} interleaved "
        f"rounds after a warm-up round, {args.decode_steps} decoded tokens per decode measurement; {cpu}; "
        f"torch {versions['torch']}, transformers {versions['transformers']}. Time ratio < 1 is faster."
    )
    write_results(args.out, rows, markdown(rows, header))
    plot(rows, Path(f"{args.out}.png"), f"{args.model} decode, batch 1, {cpu}")
    print(markdown(rows, header))


if __name__ == "__main__":
    main()
