"""The captioner of a run: a `VisionEncoderDecoderModel` (frozen vision encoder, text decoder with
cross-attention) patched with the run's gate; its tokenizer and image processor, the checks made before
anything trains, the encoder features computed once, and the collator that feeds them to the decoder.

The model stays a standard `VisionEncoderDecoderModel` (save, load, `generate(pixel_values=...)`); only
training and evaluation skip the frozen encoder by passing its cached output as `encoder_outputs`.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, VisionEncoderDecoderModel, set_seed
from transformers.modeling_outputs import BaseModelOutput

from ...core.families import find_attention
from ...core.hooks import attention_layout
from ...offline import resolve_model
from ...sharing.loading import checkpoint_config, load_processor
from ...sharing.loading import from_pretrained as load_gated
from ..common.config import RunSpec
from ..common.distributed import patch_on_device
from .config import DECODERS, CaptioningConfig

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
FEATURES_FILE = "encoder_features.safetensors"


# ------------------------------------------------------------------------------------ tokenizer


def build_word_tokenizer(captions: list[str]) -> transformers.PreTrainedTokenizerFast:
    """A word-level tokenizer of the words of `captions` (split on whitespace: one token per word), with
    `<pad>`, `<s>` (the decoder's start), `</s>` and `<unk>`."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted({word for caption in captions for word in caption.split()})
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS.values(), *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **SPECIAL_TOKENS)


def load_tokenizer(config: CaptioningConfig, decoder_path: str | None, train_captions: list[str]):
    """The word-level tokenizer of the training captions for a `scratch-*` decoder, else the decoder's own
    (its EOS as pad token when it has none)."""
    if decoder_path is None:
        return build_word_tokenizer(train_captions)
    try:
        tokenizer = load_processor(decoder_path)
    except OSError as err:  # the first read of the decoder: a Hub id offline or mistyped, a folder without it
        raise OSError(
            f"decoder {config.decoder!r}: {err} (the built-in decoders: {', '.join(DECODERS)})"
        ) from err
    if not tokenizer.is_fast:
        raise ValueError(f"decoder {config.decoder!r}: the recipe needs a fast tokenizer (word offsets)")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.sep_token
    return tokenizer


def start_and_end(tokenizer) -> tuple[int, int]:
    """`(decoder start id, end id)`: BOS (or CLS) and EOS (or SEP)."""
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id
    end = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    if start is None or end is None:
        raise ValueError(
            "the decoder's tokenizer has no BOS/CLS or no EOS/SEP token to start and end captions"
        )
    return start, end


def encode_caption(tokenizer, caption: str, max_tokens: int) -> tuple[list[int], list[int | None]]:
    """`(token ids, index of the first token of each word)` of a caption (no special tokens), truncated to
    `max_tokens` (a word cut off gets `None`)."""
    encoded = tokenizer(caption, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"][:max_tokens], encoded["offset_mapping"][:max_tokens]
    starts, position = [], 0
    for word in caption.split():
        position = caption.index(word, position)
        starts.append(next((i for i, (a, b) in enumerate(offsets) if a <= position < b), None))
        position += len(word)
    return ids, starts


# ------------------------------------------------------------------------------------ the model


def model_paths(config: CaptioningConfig) -> tuple[str, str | None]:
    """`(encoder folder or Hub id, decoder folder or Hub id, or None for a scratch-* decoder)`."""
    decoder = None if config.decoder in DECODERS else resolve_model(config.decoder)
    return resolve_model(config.encoder), decoder


def decoder_config(config: CaptioningConfig, decoder_path: str | None, tokenizer):
    """The decoder's config, with cross-attention asked for (`is_decoder`, `add_cross_attention`)."""
    start, end = start_and_end(tokenizer)
    tokens = {"bos_token_id": start, "eos_token_id": end, "pad_token_id": tokenizer.pad_token_id}
    cross = {"is_decoder": True, "add_cross_attention": True}
    if decoder_path is not None:
        return AutoConfig.from_pretrained(decoder_path, **cross)
    positions = config.max_caption_tokens + 2
    dropout = config.decoder_dropout
    if config.decoder == "scratch-gpt2":
        return transformers.GPT2Config(
            vocab_size=len(tokenizer),
            n_positions=positions,
            n_embd=config.decoder_hidden_size,
            n_layer=config.decoder_layers,
            n_head=config.decoder_heads,
            resid_pdrop=dropout,
            embd_pdrop=dropout,
            attn_pdrop=dropout,
            **tokens,
            **cross,
        )
    return transformers.BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.decoder_hidden_size,
        num_hidden_layers=config.decoder_layers,
        num_attention_heads=config.decoder_heads,
        intermediate_size=4 * config.decoder_hidden_size,
        max_position_embeddings=positions,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        **tokens,
        **cross,
    )


def _assemble(encoder, decoder, tokenizer) -> VisionEncoderDecoderModel:
    model = VisionEncoderDecoderModel(encoder=encoder, decoder=decoder)
    start, end = start_and_end(tokenizer)
    for target in (model.config, model.generation_config):
        target.decoder_start_token_id, target.eos_token_id = start, end
        target.pad_token_id, target.bos_token_id = tokenizer.pad_token_id, start
    return model


def check_captioner(config: CaptioningConfig, encoder_path: str, decoder_path: str | None, tokenizer) -> None:
    """`ValueError` before anything trains: an encoder that is not a vision model or whose patches do not
    tile `image_size`, a decoder without cross-attention, a gate that touches the encoder (its features are
    computed once) or that cannot patch this model (`patch` on a weightless copy, `backend` included)."""
    from ...core.patching import patch, unpatch

    encoder_config = checkpoint_config(encoder_path)
    patch_size = getattr(encoder_config, "patch_size", None)
    if getattr(encoder_config, "num_channels", None) is None or not isinstance(patch_size, int):
        raise ValueError(
            f"encoder {config.encoder!r} is not a vision transformer (no num_channels/patch_size)"
        )
    if config.image_size % patch_size:
        raise ValueError(
            f"image_size={config.image_size} is not a multiple of the encoder's patch size {patch_size}"
        )
    decoder_cfg = decoder_config(config, decoder_path, tokenizer)
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        decoder = AutoModelForCausalLM.from_config(decoder_cfg)
        model = _assemble(AutoModel.from_config(encoder_config), decoder, tokenizer)
        kinds = {block.kind for block in find_attention(model) if block.name.startswith("decoder.")}
        if "cross" not in kinds:
            raise ValueError(
                f"decoder {config.decoder!r} ({decoder_cfg.model_type}) has no cross-attention: it cannot "
                "read the image. Use scratch-gpt2, scratch-bert, or a pretrained decoder whose config takes "
                "add_cross_attention=True (GPT-2, BERT, RoBERTa, ...)"
            )
        for run in config.runs:
            if run.gate is None:
                continue
            outside = [b.name for b in attention_layout(model, run.gate) if not b.name.startswith("decoder.")]
            if outside:
                raise ValueError(
                    f"run {run.name!r} gates {outside[0]} (and {len(outside) - 1} more) outside the decoder; "
                    "the encoder is frozen and its features computed once: set the gate's parts: [decoder]"
                )
            unpatch(patch(model, run.gate, backend=config.backend))


def build_captioner(
    config: CaptioningConfig, encoder_path: str, decoder_path: str | None, tokenizer, run: RunSpec
):
    """The captioner of `run`: the pretrained encoder (frozen), the decoder (from scratch, or pretrained) and
    the projection between them drawn from `config.seed` (the same for every run), then the run's gate."""
    set_seed(config.seed)
    encoder = AutoModel.from_pretrained(encoder_path, dtype=torch.float32)
    decoder_cfg = decoder_config(config, decoder_path, tokenizer)
    if decoder_path is None:
        decoder = AutoModelForCausalLM.from_config(decoder_cfg)
    else:
        decoder = AutoModelForCausalLM.from_pretrained(decoder_path, config=decoder_cfg, dtype=torch.float32)
    set_seed(config.seed)
    model = _assemble(encoder, decoder, tokenizer)
    model.set_attn_implementation(config.attn_implementation)
    model.encoder.requires_grad_(False)
    if run.gate is not None:
        set_seed(config.seed)
        patch_on_device(model, run.gate, config.backend)
    return model


def load_trained_captioner(config: CaptioningConfig, run: RunSpec, attn_implementation: str | None = None):
    """The final weights of `run` (`<run>/model`), in eval mode on the inference device."""
    final = str(config.run_dir / run.name / "model")
    kwargs = {
        "dtype": torch.float32,
        "attn_implementation": attn_implementation or config.attn_implementation,
    }
    if run.gate is not None:
        model = load_gated(final, VisionEncoderDecoderModel, backend=config.backend, **kwargs)
    else:
        model = VisionEncoderDecoderModel.from_pretrained(final, **kwargs)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval()


# ------------------------------------------------------------------------------------ images and features


def load_image_processor(encoder_path: str, image_size: int):
    """The encoder's image processor, resizing to `image_size` x `image_size` (no crop)."""
    processor = load_processor(encoder_path, transformers.AutoImageProcessor)
    processor.size = {"height": image_size, "width": image_size}
    processor.do_center_crop = False
    return processor


@torch.inference_mode()
def compute_features(encoder, processor, images: list, batch_size: int, desc: str = "") -> torch.Tensor:
    """The encoder's last hidden states of `images`: `(n, tokens, hidden)` in float16 (what is cached)."""
    from tqdm.auto import tqdm

    device = next(encoder.parameters()).device
    out = []
    for start in tqdm(
        range(0, len(images), batch_size), desc=f"Encoder features {desc}".strip(), unit="batch"
    ):
        pixels = processor(images=images[start : start + batch_size], return_tensors="pt")["pixel_values"]
        out.append(encoder(pixel_values=pixels.to(device)).last_hidden_state.half().cpu())
    return torch.cat(out)


def cached_features(config: CaptioningConfig, encoder_path: str, processor, data, fingerprint: dict) -> dict:
    """`{split: (n, tokens, hidden) float16}` of every split, read from
    `<run_dir>/encoder_features.safetensors` when it holds these splits' fingerprints, else computed by the
    frozen encoder and saved there."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = config.run_dir / FEATURES_FILE
    metadata = {split: fingerprint[split]["sha256"] for split in data.splits}
    metadata |= {"encoder": config.encoder, "image_size": str(config.image_size)}
    if path.is_file():
        try:
            with safe_open(str(path), "pt") as f:
                if f.metadata() == metadata:
                    return {split: f.get_tensor(split) for split in data.splits}
        except Exception as err:  # a truncated file: computed again
            logger.warning("%s unreadable (%s); computing the features again", path, err)
    encoder = AutoModel.from_pretrained(encoder_path, dtype=torch.float32).eval()
    encoder.set_attn_implementation("sdpa")
    features = {
        split: compute_features(
            encoder, processor, [row["image"] for row in rows], config.feature_batch_size, split
        )
        for split, rows in data.splits.items()
    }
    tmp = path.with_suffix(".tmp")
    save_file({k: v.contiguous() for k, v in features.items()}, str(tmp), metadata=metadata)
    Path(tmp).replace(path)
    return features


def patch_grid(encoder_path: str, image_size: int) -> int:
    """Patches per side of the encoder's grid at `image_size`."""
    return image_size // checkpoint_config(encoder_path).patch_size


# ------------------------------------------------------------------------------------ training batches


def caption_rows(tokenizer, captions: list[str], max_tokens: int) -> list[dict]:
    """Training rows `{"index": i, "labels": caption ids + end id}` (the index into the split's features)."""
    end = start_and_end(tokenizer)[1]
    return [
        {"index": i, "labels": encode_caption(tokenizer, caption, max_tokens)[0] + [end]}
        for i, caption in enumerate(captions)
    ]


class CaptionCollator:
    """Rows `{"index", "labels"}` -> `{"encoder_outputs": ((batch, tokens, hidden),), "labels": (batch,
    length)}`, labels padded with -100 (the model shifts them right behind the start token)."""

    def __init__(self, features: torch.Tensor):
        self.features = features

    def __call__(self, rows: list[dict]) -> dict:
        length = max(len(row["labels"]) for row in rows)
        labels = torch.full((len(rows), length), -100, dtype=torch.long)
        for i, row in enumerate(rows):
            labels[i, : len(row["labels"])] = torch.tensor(row["labels"])
        features = self.features[[row["index"] for row in rows]].float()
        return {"encoder_outputs": (features,), "labels": labels}


def encoder_outputs(features: torch.Tensor, device) -> BaseModelOutput:
    return BaseModelOutput(last_hidden_state=features.to(device=device, dtype=torch.float32))
