"""`hf-gate-attention`: patch, recipe, diagnose, card, push and info from the command line.

hf-gate-attention patch HuggingFaceTB/SmolLM2-135M-Instruct smollm2-gated --variant output
hf-gate-attention info smollm2-gated
hf-gate-attention card smollm2-gated --results results/reproduce
hf-gate-attention push smollm2-gated me/smollm2-gated --private
hf-gate-attention recipe summarization --config recipes/summarization/configs/demo.yaml
hf-gate-attention recipe distillation report results/distill --out results/DISTILLATION.md
hf-gate-attention diagnose SmolLM2-135M-Instruct smollm2-gated --out diagnostics/
hf-gate-attention convert QwQZh/gated_attention gated-headwise --subfolder 1B_gate_headwise
hf-gate-attention convert qwen3-gated qwen3_5-checkpoint --to qwen3_5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

from .core.backends import backend_named, backend_names
from .core.config import GateConfig

PROG = "hf-gate-attention"
# Errors caused by the input (arguments, files, models, network): one line on stderr, exit status 2.
INPUT_ERRORS = (ValueError, OSError, KeyError, ImportError)


def _parse_layers(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected layer indices such as 0,1,5; got {text!r}") from None


def _at_least(low: int):
    """An argparse type: an int >= `low`, else a message naming the value and the range."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}; got {text!r}")
        return value

    return parse


def _fraction(text: str) -> float:
    """An argparse type: a float in (0, 1], else a message naming the value and the range."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1]; got {text!r}")
    return value


def _parse_names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(","))


# how a GateConfig field is read from the command line, by its annotation (`str` with its choices otherwise)
_PARSERS = {
    "int": int,
    "int | None": int,
    "tuple[int, ...] | None": _parse_layers,
    "tuple[str, ...]": _parse_names,
    "tuple[str, ...] | None": _parse_names,
}


def _add_gate_options(parser: argparse.ArgumentParser) -> None:
    """One option per `GateConfig` field (`--top-k-unit` for `top_k_unit`), with its help, choices and
    default taken from the field, so that the command line cannot drift from the config."""
    for option in dataclasses.fields(GateConfig):
        parser.add_argument(
            f"--{option.name.replace('_', '-')}",
            type=_PARSERS.get(str(option.type), str),
            choices=option.metadata.get("choices"),
            default=option.default,
            help=option.metadata["help"],
        )


def _gate_config(args) -> GateConfig:
    return GateConfig(**{field.name: getattr(args, field.name) for field in dataclasses.fields(GateConfig)})


def _add_backend_option(parser: argparse.ArgumentParser) -> None:
    summaries = "; ".join(f"{name}: {backend_named(name).summary}" for name in backend_names()[1:])
    parser.add_argument(
        "--backend",
        choices=backend_names(),
        default="auto",
        help=f"what runs the gates (default auto: the fused backends on a CUDA GPU, else torch). {summaries}",
    )


def _load_processor(model_path: str):
    """The tokenizer or image processor saved beside `model_path`, or `None` if it has neither."""
    import transformers

    for auto in (transformers.AutoTokenizer, transformers.AutoImageProcessor):
        try:
            return auto.from_pretrained(model_path)
        except (OSError, ValueError, KeyError):
            continue
    return None


def cmd_patch(args) -> None:
    """Load a model, add gates, save it (with its tokenizer / image processor) to a new folder."""
    from .core.hooks import CONFIG_ATTRIBUTE
    from .core.patching import gate_parameters, patch
    from .files import staged_folder
    from .offline import resolve_model
    from .sharing.loading import checkpoint_config, model_class_named

    output = Path(args.output)
    gate = _gate_config(args)
    # refuses a busy output, or one that is the input, first
    with staged_folder(output, overwrite=args.overwrite, inputs=[args.model]) as staging:
        model_path = resolve_model(args.model)
        config = checkpoint_config(model_path)
        if getattr(config, CONFIG_ATTRIBUTE, None) is not None:
            raise ValueError(
                f"{args.model} is gated already (its config.json holds {CONFIG_ATTRIBUTE}): patching it "
                "again would replace its trained gates by new ones. Load it with "
                "hf_gate_attention.from_pretrained, or patch its base model"
            )
        class_name = args.model_class or (config.architectures or ["AutoModel"])[0]
        model_class = model_class_named(
            class_name, "--model-class" if args.model_class else "the model names"
        )
        model = model_class.from_pretrained(model_path, dtype=args.dtype)
        patch(model, gate)
        processor = _load_processor(model_path)
        model.save_pretrained(staging)
        if processor is not None:
            processor.save_pretrained(staging)
    added = sum(p.numel() for p in gate_parameters(model))
    saved_with = f" and its {type(processor).__name__}" if processor is not None else ""
    print(
        f"Saved {type(model).__name__}{saved_with} with {gate.variant}/{gate.granularity} gates to {output}"
    )
    print(f"Added parameters: {added:,}")
    if processor is None:
        print("warning: no tokenizer or image processor found beside the model; none saved", file=sys.stderr)


def _local_folder(name_or_path: str) -> Path:
    """A local folder, or the config and weights of a Hub repo downloaded to the cache."""
    from .files import require_checkpoint_folder

    require_checkpoint_folder(name_or_path)
    if Path(name_or_path).is_dir():
        return Path(name_or_path)
    from huggingface_hub import snapshot_download

    patterns = ["config.json", "*.safetensors*", "gate_adapter_config.json", "adapter_config.json"]
    return Path(snapshot_download(name_or_path, allow_patterns=patterns))


def _print_adapter_info(name: str, info: dict) -> None:
    base, gate = info["base_model"], info["gate_config"]
    revision = f" (revision {info['revision']})" if info["revision"] else ""
    print(f"{name}: gate adapter for {info['base_model_name_or_path']}{revision}")
    print(
        f"base it needs: {info['base_model_class']}, model_type={base['model_type']}, hidden_size="
        f"{base['hidden_size']}, heads={base['num_attention_heads']}/{base['num_key_value_heads']} (kv), "
        f"layers={base['num_hidden_layers']}"
    )
    print(
        f"gate: variant={gate['variant']} granularity={gate['granularity']} init={gate['init']} "
        f"top_k={gate['top_k']}; {len(info['gate_tensors'])} tensors, {info['gate_parameters']:,} parameters"
    )
    lora = info["lora"]
    if lora is None:
        print("LoRA: none")
    else:
        targets = ", ".join(sorted(lora["config"].get("target_modules") or []))
        print(
            f"LoRA: r={lora['config'].get('r')} on {targets}; {lora['parameters']:,} parameters (PEFT files)"
        )
    print(f"load: hf_gate_attention.load_gate_adapter({info['base_model_name_or_path']!r}, {name!r})")


def cmd_info(args) -> None:
    from .sharing.adapters import GATE_CONFIG_NAME, adapter_info
    from .sharing.statistics import checkpoint_statistics

    folder = _local_folder(args.checkpoint)
    if (folder / GATE_CONFIG_NAME).is_file():
        info = {"kind": "gate adapter", **adapter_info(folder)}
        if args.json:
            print(json.dumps(info, indent=2))
        else:
            _print_adapter_info(args.checkpoint, info)
        return
    info = {"kind": "checkpoint", **checkpoint_statistics(folder)}
    if args.json:
        print(json.dumps(info, indent=2))
        return
    gate = info["gate"]
    share = 100 * info["added_params"] / max(info["total_params"] - info["added_params"], 1)
    print(f"{args.checkpoint}: {info['model_type']} {', '.join(info['architectures'] or [])}")
    if info["layout"] == "paper":
        print(
            "layout: the paper's (gates packed into q_proj; loads with hf_gate_attention.from_pretrained, "
            "`hf-gate-attention convert` writes ours)"
        )
    print(
        f"gate: variant={gate['variant']} granularity={gate['granularity']} init={gate['init']} "
        f"top_k={gate['top_k']}"
    )
    print(f"gated layers: {info['gated_layers']}; added parameters: {info['added_params']:,} ({share:.3f} %)")
    print(f"identity gates (computes the ungated model): {'yes' if info['gates_are_identity'] else 'no'}")
    print(f"loads without this package (trust_remote_code): {'yes' if info['trust_remote_code'] else 'no'}")
    print(f"{'block':<40} {'|W| mean':>10} {'gate(0) mean':>13} {'min':>8} {'max':>8}")
    for block, stats in info["layers"].items():
        mean, low, high = (stats[f"gate_at_zero_{k}"] for k in ("mean", "min", "max"))
        print(f"{block:<40} {stats['weight_abs_mean']:>10.4g} {mean:>13.4f} {low:>8.4f} {high:>8.4f}")
    if info["non_finite"]:
        print(
            f"warning: {len(info['non_finite'])} gate tensor(s) hold NaN or inf (every output will too): "
            + ", ".join(info["non_finite"]),
            file=sys.stderr,
        )


def _card_options(args) -> dict:
    return {"results": args.results, "run": args.run, "base_model": args.base_model, "datasets": args.dataset}


def cmd_card(args) -> None:
    from . import _register_recipe_cards
    from .sharing.card import write_model_card

    _register_recipe_cards()
    path = write_model_card(args.folder, repo_id=args.repo_id, **_card_options(args))
    print(f"Wrote {path}")


def cmd_push(args) -> None:
    from . import _register_recipe_cards
    from .sharing.hub import push_to_hub

    _register_recipe_cards()
    info = push_to_hub(
        args.folder,
        args.repo_id,
        private=args.private,
        revision=args.revision,
        commit_message=args.commit_message,
        commit_description=args.commit_description,
        token=args.token,
        create_pr=args.create_pr,
        tags=args.tag,
        **_card_options(args),
    )
    print(f"Pushed {args.folder} to {getattr(info, 'pr_url', None) or getattr(info, 'commit_url', info)}")


def _add_card_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--results", help="results folder of the recipe that trained the model (results/<name>)"
    )
    parser.add_argument("--run", help="which run of --results this model is (default: the one with its gate)")
    parser.add_argument("--base-model", help="Hub id of the model the gates were added to")
    parser.add_argument("--dataset", action="append", help="Hub dataset id used for training (repeatable)")


def _read_images(paths: list[str]) -> list:
    """The images at `paths` as RGB PIL images; `FileNotFoundError` / `ValueError` naming the files that are
    missing or not images."""
    from PIL import Image, UnidentifiedImageError

    missing = [str(p) for p in paths if not Path(p).is_file()]
    if missing:
        raise FileNotFoundError(f"image file(s) not found: {', '.join(missing)}")
    images = []
    for path in paths:
        try:
            images.append(Image.open(path).convert("RGB"))
        except (UnidentifiedImageError, OSError) as err:
            raise ValueError(f"--images: {path} is not an image file PIL can read ({err})") from None
    return images


def _diagnosis_inputs(args, model_path: str) -> list[dict]:
    """The inputs of `diagnose` from --text-file, --dataset or --images, at most --max-inputs, prepared by
    the tokenizer (image processor) of --tokenizer or else of the model."""
    import transformers

    from .diagnostics import image_inputs, read_texts, text_inputs
    from .offline import resolve_model
    from .sharing.loading import load_processor

    model_path = resolve_model(args.tokenizer) if args.tokenizer else model_path
    if args.images:
        images = _read_images(args.images[: args.max_inputs])
        return image_inputs(load_processor(model_path, transformers.AutoImageProcessor), images)
    if args.text_file:
        texts = read_texts(args.text_file)
    else:
        from .recipes.common.summaries.data import load_summarization_dataset

        texts = load_summarization_dataset(args.dataset, splits=["test"])["test"]["document"]
    tokenizer = load_processor(model_path)
    inputs = text_inputs(tokenizer, texts, args.max_length, min_length=args.skip_queries + 4)
    if not inputs:
        raise ValueError(f"no text has at least {args.skip_queries + 4} tokens to diagnose")
    return inputs[: args.max_inputs]


def _load_for_diagnosis(name_or_path: str, attn_implementation: str, backend: str):
    """`(model in float32, its local path)`, gated (its gates run on `backend`) or not."""
    from .offline import resolve_model
    from .sharing.loading import load_model

    path = resolve_model(name_or_path)
    model = load_model(path, backend=backend, dtype=torch.float32, attn_implementation=attn_implementation)
    return model, path


def cmd_diagnose(args) -> None:
    """Diagnose one or several models on the same inputs; write JSON/PNG per model and a summary table."""
    from .diagnostics import diagnose
    from .diagnostics.report import plot_layers, summary_table, write_diagnosis
    from .files import atomic_write_text

    labels = args.labels.split(",") if args.labels else [Path(m.rstrip("/")).name for m in args.models]
    if args.labels and len(labels) != len(args.models):
        raise ValueError(f"--labels has {len(labels)} names for {len(args.models)} models")
    if len(set(labels)) != len(labels):
        raise ValueError(f"model labels must be unique, got {labels}; pass --labels")
    out = Path(args.out)
    file = next((p for p in (out, *out.parents) if p.is_file()), None)
    if file is not None:  # refused before the diagnosis runs, not after
        raise NotADirectoryError(f"--out {out}: {file} is a file; name a folder to write the diagnosis in")
    if args.images:
        _read_images(args.images[: args.max_inputs])  # a bad file is named before any model loads
    results = {}
    prepared: dict[str, list[dict]] = {}  # tokenizer / processor folder -> inputs, read once per folder
    for label, name in zip(labels, args.models, strict=True):
        model, path = _load_for_diagnosis(name, args.attn_implementation, args.backend)
        source = args.tokenizer or path
        if source not in prepared:
            prepared[source] = _diagnosis_inputs(args, path)
        results[label] = diagnose(
            model, prepared[source], skip_queries=args.skip_queries, progress=True, part=args.part
        )
        files = write_diagnosis(results[label], out / label if len(args.models) > 1 else out, title=label)
        print(f"{label}: wrote {', '.join(str(f) for f in files)}")
    summary = summary_table({label: result["summary"] for label, result in results.items()})
    if len(results) > 1:
        plot_layers(results, out / "layers.png")
        atomic_write_text(out / "summary.md", summary + "\n")
    print(summary)


def cmd_convert(args) -> None:
    """Convert a checkpoint in the paper's layout or Qwen3.5's to ours (`--to ours`, the layout read off the
    source's `model_type`), or one of ours to the paper's (`--to paper`) or Qwen3.5's (`--to qwen3_5`)."""
    from transformers.utils import cached_file

    from .core.patching import gate_config_of
    from .files import read_json, require_checkpoint_folder, staged_folder
    from .sharing.layouts import (
        is_qwen3_5_config,
        load_paper_checkpoint,
        load_qwen3_5_checkpoint,
        write_paper_layout,
        write_qwen3_5_checkpoint,
    )
    from .sharing.loading import from_pretrained, load_processor

    hub = {"subfolder": args.subfolder} if args.subfolder else {}
    if args.keep_biases and args.to != "qwen3_5":
        raise ValueError("--keep-biases applies to --to qwen3_5 only")
    require_checkpoint_folder(args.source, "source")
    try:
        tokenizer = load_processor(args.source, **hub)
    except (OSError, ValueError, KeyError):
        tokenizer = None
    with staged_folder(Path(args.output), overwrite=args.overwrite, inputs=[args.source]) as staging:
        if args.to == "ours":
            config = read_json(cached_file(args.source, "config.json", **hub))
            load = load_qwen3_5_checkpoint if is_qwen3_5_config(config) else load_paper_checkpoint
            model = load(args.source, backend="torch", **hub)
            model.save_pretrained(staging)
        else:
            model = from_pretrained(args.source, backend="torch", **hub)
            if args.to == "qwen3_5":
                write_qwen3_5_checkpoint(model, staging, keep_biases=args.keep_biases)
            else:
                write_paper_layout(model, staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
    layout = {"ours": "our layout", "paper": "the paper's layout", "qwen3_5": "Qwen3.5's layout"}[args.to]
    granularity = gate_config_of(model).granularity
    print(f"Wrote {type(model).__name__} ({granularity} gates) in {layout} to {args.output}")
    if tokenizer is None:
        print("warning: no tokenizer found beside the source checkpoint; none saved", file=sys.stderr)


def cmd_serve(args) -> None:
    """transformers' OpenAI-compatible server with the gated model loaded by this package."""
    from transformers.utils.import_utils import is_serve_available

    if not is_serve_available():
        raise ValueError(
            "serve needs transformers' server dependencies (fastapi, uvicorn, pydantic, openai): "
            "pip install 'hf-gate-attention[serving]'"
        )
    from .serving import GatedServe

    GatedServe(
        force_model=args.model,
        host=args.host,
        port=args.port,
        continuous_batching=args.continuous_batching,
        device=args.device,
        dtype=args.dtype,
        attn_implementation=args.attn_implementation,
        max_model_len=args.max_model_len,
        cb_num_blocks=args.cb_num_blocks,
        cb_max_batch_tokens=args.cb_max_batch_tokens,
        cb_max_memory_percent=args.cb_max_memory_percent,
        log_level=args.log_level,
        backend=args.backend,
    )


def _recipe_command_help() -> str:
    """The `recipe` command's line in `--help`, naming the registered recipes (or the extra they need)."""
    try:
        from .recipes.registry import RECIPES
    except ImportError:
        names = "needs the [recipes] extra"
    else:
        names = ", ".join(RECIPES)
    return f"run a recipe ({names}) or one of its actions (see `{PROG} recipe --help`)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Gated attention for Hugging Face models: patch, fine-tune, describe and share.",
        allow_abbrev=False,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    patch_parser = commands.add_parser("patch", help="add gates to a model and save it as a gated checkpoint")
    patch_parser.add_argument("model", help="Hub id or local folder (offline: SmolLM2-135M-Instruct, ...)")
    patch_parser.add_argument("output", help="folder to write (must be new or empty, or --overwrite)")
    _add_gate_options(patch_parser)
    patch_parser.add_argument(
        "--model-class", help="transformers class, e.g. AutoModelForSequenceClassification"
    )
    patch_parser.add_argument("--dtype", default="auto", help="auto (as saved), float32, bfloat16, float16")
    patch_parser.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    patch_parser.set_defaults(func=cmd_patch)

    commands.add_parser("recipe", help=_recipe_command_help(), add_help=False)
    commands.add_parser(
        "summarize", help="= `hf-gate-attention recipe summarization` (hf-gate-summarize)", add_help=False
    )

    card_parser = commands.add_parser("card", help="write README.md (model card) into a gated checkpoint")
    card_parser.add_argument("folder", help="gated checkpoint folder")
    _add_card_options(card_parser)
    card_parser.add_argument("--repo-id", help="repo id shown in the usage snippets")
    card_parser.set_defaults(func=cmd_card)

    push_parser = commands.add_parser(
        "push", help="upload a gated checkpoint folder (and its card) to the Hub"
    )
    push_parser.add_argument("folder", help="gated checkpoint folder")
    push_parser.add_argument("repo_id", help="namespace/name on the Hub (created if missing)")
    _add_card_options(push_parser)
    push_parser.add_argument("--private", action="store_true", default=None, help="create the repo private")
    push_parser.add_argument("--revision", help="branch to push to (created if missing)")
    push_parser.add_argument("--commit-message")
    push_parser.add_argument("--commit-description")
    push_parser.add_argument("--tag", action="append", help="tag added to the card's metadata (repeatable)")
    push_parser.add_argument("--create-pr", action="store_true", help="open a pull request instead")
    push_parser.add_argument("--token", help="Hub token (default: HF_TOKEN or `hf auth login`)")
    push_parser.set_defaults(func=cmd_push)

    diagnose_parser = commands.add_parser(
        "diagnose", help="attention sink, massive activations and gate statistics of models on real inputs"
    )
    diagnose_parser.add_argument("models", nargs="+", help="model folders or Hub ids, gated or not")
    diagnose_parser.add_argument("--out", required=True, help="folder for diagnostics.json and the PNGs")
    source = diagnose_parser.add_mutually_exclusive_group()
    source.add_argument("--text-file", help="a .jsonl file (field text) or a text file (a document per line)")
    source.add_argument(
        "--dataset",
        default="aclsum",
        help="summarization dataset whose test documents are read (default aclsum: paper bodies)",
    )
    source.add_argument("--images", nargs="+", help="image files (vision models)")
    diagnose_parser.add_argument(
        "--max-inputs", type=_at_least(1), default=8, help="inputs to diagnose (default 8)"
    )
    diagnose_parser.add_argument(
        "--max-length", type=_at_least(1), default=512, help="tokens per text (default 512)"
    )
    diagnose_parser.add_argument(
        "--skip-queries", type=_at_least(0), default=4, help="first queries left out (4)"
    )
    diagnose_parser.add_argument("--labels", help="comma-separated names of the models in the outputs")
    diagnose_parser.add_argument(
        "--tokenizer", help="where the tokenizer / image processor is, when not saved with the models"
    )
    diagnose_parser.add_argument("--attn-implementation", default="sdpa", help="sdpa (default), eager, ...")
    diagnose_parser.add_argument(
        "--part",
        help="the stack of a model with several, by module name segment (decoder: an encoder-decoder's "
        "decoder; its gated cross-attention is reported beside it)",
    )
    _add_backend_option(diagnose_parser)
    diagnose_parser.set_defaults(func=cmd_diagnose)

    convert_parser = commands.add_parser(
        "convert", help="convert a gated checkpoint between ours and the paper's or Qwen3.5's q_proj layout"
    )
    convert_parser.add_argument("source", help="checkpoint folder or Hub id (e.g. QwQZh/gated_attention)")
    convert_parser.add_argument("output", help="folder to write (must be new or empty, or --overwrite)")
    convert_parser.add_argument(
        "--to",
        choices=["ours", "paper", "qwen3_5"],
        default="ours",
        help="ours (default): read a checkpoint in the paper's layout or a Qwen3.5 text one (all layers full "
        "attention); paper: read one of ours; qwen3_5: read one of ours (qwen3, variant output), write a "
        "transformers Qwen3_5ForCausalLM checkpoint",
    )
    convert_parser.add_argument(
        "--keep-biases",
        action="store_true",
        help="--to qwen3_5: write nonzero attention biases (gate, q/k/v/o), which vLLM and SGLang drop",
    )
    convert_parser.add_argument("--subfolder", help="folder inside the Hub repo (e.g. 1B_gate_headwise)")
    convert_parser.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    convert_parser.set_defaults(func=cmd_convert)

    serve_parser = commands.add_parser(
        "serve",
        help="serve a gated checkpoint with transformers' OpenAI-compatible server ([serving] extra)",
    )
    serve_parser.add_argument("model", help="gated checkpoint (ours or the paper's layout): folder or Hub id")
    serve_parser.add_argument("--host", default="localhost", help="listen address (default localhost)")
    serve_parser.add_argument("--port", type=_at_least(1), default=8000, help="listen port (default 8000)")
    serve_parser.add_argument(
        "--continuous-batching", action="store_true", help="continuous batching over paged attention"
    )
    serve_parser.add_argument("--device", default="auto", help="auto (default), cpu, cuda:0, ...")
    serve_parser.add_argument("--dtype", default="auto", help="auto (default: the weights'), bfloat16, ...")
    serve_parser.add_argument("--attn-implementation", help="sdpa, eager, flash_attention_2, ...")
    serve_parser.add_argument("--max-model-len", type=_at_least(1), help="longest prompt plus answer, tokens")
    serve_parser.add_argument(
        "--cb-num-blocks",
        type=_at_least(1),
        help="continuous batching: KV cache blocks (default: from memory)",
    )
    serve_parser.add_argument(
        "--cb-max-batch-tokens", type=_at_least(1), help="continuous batching: most tokens in one batch"
    )
    serve_parser.add_argument(
        "--cb-max-memory-percent",
        type=_fraction,
        help="continuous batching: the share of free memory the KV cache may take, 0-1 (default 0.9)",
    )
    serve_parser.add_argument("--log-level", default="warning", help="warning (default), info, debug")
    _add_backend_option(serve_parser)
    serve_parser.set_defaults(func=cmd_serve)

    info_parser = commands.add_parser(
        "info", help="what a gated checkpoint (ours or the paper's layout) or a gate adapter contains"
    )
    info_parser.add_argument("checkpoint", help="gated checkpoint or gate adapter: folder or Hub id")
    info_parser.add_argument("--json", action="store_true", help="print JSON")
    info_parser.set_defaults(func=cmd_info)
    return parser


def _recipe_registry(prog: str):
    """The recipes' registry, or `None` after naming the extra to install (the recipes' stack is missing)."""
    try:
        from .recipes import registry
    except ImportError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return None
    return registry


def _recipe_parser(registry) -> argparse.ArgumentParser:
    """`hf-gate-attention recipe --help`: the recipes and their actions."""
    prog = f"{PROG} recipe"
    lines = [f"recipes ({prog} NAME --help: its config keys and actions):"]
    for recipe in registry.RECIPES.values():
        lines.append(f"  {recipe.name:<15} {recipe.help}")
        if recipe.actions:
            lines.append(f"  {'':<15} actions: {', '.join(action.name for action in recipe.actions)}")
    parser = argparse.ArgumentParser(
        prog=prog,
        usage=f"{prog} NAME [ACTION ...] | NAME [--config FILE] [KEY=VALUE ...]",
        description="Run a recipe: `NAME [--config FILE] [KEY=VALUE ...]` trains and compares the runs of "
        "its config, writing <output_dir>/<name>/; or one of its actions: `NAME ACTION ...`.",
        epilog="\n".join(lines),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("name", choices=list(registry.RECIPES), metavar="NAME", help="the recipe")
    return parser


def recipe_main(argv: list[str]) -> int:
    """`hf-gate-attention recipe NAME [ACTION] ...`: a recipe's run or action (`recipes.registry`), or exit
    status 2 with the extra to install when the recipes' stack is missing."""
    prog = f"{PROG} recipe"
    registry = _recipe_registry(prog)
    if registry is None:
        return 2
    if argv and argv[0] in registry.RECIPES:
        return registry.run_recipe(argv[0], argv[1:], f"{prog} {argv[0]}")
    _recipe_parser(registry).parse_known_args(argv)  # --help, or the error that names the recipes
    return 2


def summarize_main(argv: list[str] | None = None, prog: str = "hf-gate-summarize") -> int:
    """`hf-gate-summarize` (= `hf-gate-attention summarize`, `hf-gate-attention recipe summarization`);
    `prog` is the name its messages and `--help` give it."""
    registry = _recipe_registry(prog)
    if registry is None:
        return 2
    return registry.run_recipe("summarization", sys.argv[1:] if argv is None else argv, prog)


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; returns the exit status (2 with a one-line reason for bad input)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["summarize"]:
        return summarize_main(argv[1:], f"{PROG} summarize")
    if argv[:1] == ["recipe"]:
        return recipe_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except INPUT_ERRORS as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
