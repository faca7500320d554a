"""Shared test helpers: tiny random models of every registered family, and the recipe's tiny assets."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import torch
import transformers
import yaml
from tokenizers import Tokenizer, models, pre_tokenizers

from hf_gate_attention.core.variants import GATE_VARIANTS

VARIANTS = tuple(GATE_VARIANTS)  # every declared variant: the tests that run over them cover a new one
GRANULARITIES = ("headwise", "elementwise")

_TEXT = {"vocab_size": 99, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_DECODER = {
    **_TEXT,
    "hidden_size": 32,
    "intermediate_size": 37,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "attention_dropout": 0.0,
}
_ENCODER = {
    "hidden_size": 32,
    "intermediate_size": 37,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
# model_type -> (config kwargs, Auto class of the task head tested)
TINY_MODELS = {
    "llama": (_DECODER, transformers.AutoModelForCausalLM),
    "mistral": (_DECODER, transformers.AutoModelForCausalLM),
    "qwen2": (_DECODER, transformers.AutoModelForCausalLM),
    "qwen3": (_DECODER, transformers.AutoModelForCausalLM),
    "gemma": (_DECODER, transformers.AutoModelForCausalLM),
    "gemma2": (_DECODER, transformers.AutoModelForCausalLM),
    "gemma3_text": (_DECODER, transformers.AutoModelForCausalLM),
    "phi3": ({k: v for k, v in _DECODER.items() if k != "head_dim"}, transformers.AutoModelForCausalLM),
    "bert": ({**_ENCODER, **_TEXT}, transformers.AutoModelForSequenceClassification),
    "roberta": ({**_ENCODER, **_TEXT, "pad_token_id": 1}, transformers.AutoModelForMaskedLM),
    "vit": ({**_ENCODER, "image_size": 30, "patch_size": 10}, transformers.AutoModelForImageClassification),
    "dinov2": ({**_ENCODER, "image_size": 28, "patch_size": 14}, transformers.AutoModel),
}
IMAGE_MODELS = ("vit", "dinov2")


def interpreter_rounds_bfloat16_to_nearest(monkeypatch) -> None:
    """Triton's interpreter converts float32 to bfloat16 by truncation, GPUs round to nearest even; truncation
    doubles the rounding error of every bfloat16 result (Triton's docs: the interpreter does not support
    bfloat16). Make the interpreter round like a GPU, so that bfloat16 tolerances relative to PyTorch's own
    rounding measure the kernel."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    convert = interpreter._convert_float

    def round_to_nearest_even(values, input_dtype, output_dtype, rounding_mode):
        if input_dtype != tl.float32 or output_dtype != tl.bfloat16:
            return convert(values, input_dtype, output_dtype, rounding_mode)
        bits = np.ascontiguousarray(values).view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)

    monkeypatch.setattr(interpreter, "_convert_float", round_to_nearest_even)


def tiny_model(
    model_type: str, seed: int = 0, attn_implementation: str = "eager", bare: bool = False, **overrides
):
    """A randomly initialised tiny model of `model_type` in eval mode: with its task head of `TINY_MODELS`,
    or the bare model (`AutoModel`) with `bare=True`."""
    kwargs, auto_class = TINY_MODELS[model_type]
    config = transformers.AutoConfig.for_model(model_type, **{**kwargs, **overrides})
    torch.manual_seed(seed)
    auto_class = transformers.AutoModel if bare else auto_class
    model = auto_class.from_config(config, attn_implementation=attn_implementation)
    return model.eval()


def tiny_inputs(model_type: str, batch: int = 2, length: int = 11, seed: int = 1) -> dict:
    """Model inputs of the right kind: token ids (never the pad id) or pixel values."""
    generator = torch.Generator().manual_seed(seed)
    if model_type in IMAGE_MODELS:
        size = TINY_MODELS[model_type][0]["image_size"]
        return {"pixel_values": torch.randn(batch, 3, size, size, generator=generator)}
    return {"input_ids": torch.randint(3, 99, (batch, length), generator=generator)}


def first_output(outputs) -> torch.Tensor:
    """logits for heads, last_hidden_state for bare models."""
    return outputs.logits if hasattr(outputs, "logits") else outputs.last_hidden_state


def added_ops_per_layer(model, config, backend: str) -> Counter:
    """The aten ops called from Python (not from inside another aten op) in one eager decode step of `model`
    patched with `config` on `backend`, minus those of the same model ungated, per layer."""
    from hf_gate_attention import patch

    def step_ops() -> Counter:
        prompt, token = torch.randint(3, 64, (1, 8)), torch.randint(3, 64, (1, 1))
        with torch.no_grad():
            cache = transformers.DynamicCache(config=model.config)
            model(input_ids=prompt, cache=cache, use_cache=True)
            with torch.profiler.profile() as profile:
                model(input_ids=token, cache=cache, use_cache=True)
        return Counter(
            event.name
            for event in profile.events()
            if event.name.startswith("aten::")
            and not (event.cpu_parent and event.cpu_parent.name.startswith("aten::"))
        )

    ungated = step_ops()
    patch(model, config, backend=backend)
    added = step_ops() - ungated
    layers = model.config.num_hidden_layers
    assert all(count % layers == 0 for count in added.values()), added
    return Counter({name: count // layers for name, count in added.items()})


# ------------------------------------------------------------------ the summarization recipe's tiny assets

WORDS = [f"w{i}" for i in range(12)]
PROMPT_WORDS = ["Summarize", "the", "following", "paper", "Document", "Summary"]
SPECIAL = ["<pad>", "<s>", "</s>", "<unk>"]
RUNS = [
    {"name": "baseline", "gate": None},
    {"name": "output-headwise", "gate": {"variant": "output", "granularity": "headwise"}},
    {"name": "qk-elementwise", "gate": {"variant": "qk", "granularity": "elementwise"}},
]


def _document(rng: random.Random) -> str:
    sentences = [" ".join(rng.choices(WORDS, k=rng.randint(4, 8))) + " ." for _ in range(rng.randint(4, 8))]
    return " ".join(sentences)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def make_dataset(folder: Path, empty_train_documents: int = 0) -> Path:
    """train/validation/test JSONL files; the summary is the first sentence of the document."""
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    for split, size in (("train", 12), ("validation", 4), ("test", 4)):
        rows = []
        for i in range(size):
            document = _document(rng)
            rows.append(
                {"id": f"{split}-{i}", "document": document, "summary": document.split(" . ")[0] + " ."}
            )
        if split == "train":
            rows += [
                {"id": f"empty-{i}", "document": " ", "summary": "w1 ."} for i in range(empty_train_documents)
            ]
        write_jsonl(folder / f"{split}.jsonl", rows)
    return folder


def make_tiny_model(folder: Path) -> Path:
    """A random 2-layer LlamaForCausalLM and a word-level tokenizer (no chat template) saved in `folder`."""
    vocab = {token: i for i, token in enumerate(SPECIAL + WORDS + PROMPT_WORDS + [".", ":", "[", "]"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    model = tiny_model("llama", vocab_size=len(vocab), max_position_embeddings=256)
    with torch.no_grad():  # special tokens get logit 0, below the best word: summaries are words, never empty
        model.lm_head.weight[: len(SPECIAL)] = 0
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_config(assets: dict[str, Path], output_dir: Path, **overrides) -> dict:
    """Config keys of a comparison that runs in seconds."""
    return {
        "name": "tiny",
        "output_dir": str(output_dir),
        "model": str(assets["model"]),
        "dataset": str(assets["data"]),
        "attn_implementation": "eager",
        "runs": RUNS,
        "doc_token_budget": 48,
        "max_summary_tokens": 12,
        "max_steps": 4,
        "per_device_train_batch_size": 2,
        "learning_rate": 1e-4,
        "gate_learning_rate": 1e-2,
        "logging_steps": 1,
        "eval_steps": 2,
        "save_steps": 2,
        "max_new_tokens": 6,
        "generation_batch_size": 3,
        "n_bootstrap": 50,
        "speed_examples": 2,
        "speed_rounds": 2,
        "speed_new_tokens": 4,
        **overrides,
    }


def write_config(path: Path, keys: dict) -> Path:
    path.write_text(yaml.safe_dump(keys), encoding="utf-8")
    return path


def loss_steps(run_dir: Path) -> list[int]:
    history = json.loads((run_dir / "train_summary.json").read_text())["log_history"]
    return [entry["step"] for entry in history if "loss" in entry]


REPO = Path(__file__).resolve().parents[1]


def torchrun(*args: str, nproc: int = 2, timeout: int = 600) -> str:
    """`python -m torch.distributed.run --standalone --nproc_per_node NPROC ARGS` from the repository root on
    CPU (one thread per process, offline, this checkout's package first), as a user launches it; asserts that
    it succeeded (showing the end of its output otherwise) and returns its stdout."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        *args,
    ]
    env = os.environ | {
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"torchrun {' '.join(args)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    )
    return done.stdout
