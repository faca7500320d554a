"""What the recipes with a frozen vision encoder and a text decoder with cross-attention share (captioning,
video QA): the word-level tokenizer, the decoder's config (pretrained, or from scratch), the checks before
training, the assembled `VisionEncoderDecoderModel` built for a run and loaded trained, the image processor,
and the encoder features computed once and cached in a safetensors file."""

from __future__ import annotations

import logging
import re
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
from .config import SCRATCH_DECODERS, RunSpec
from .distributed import patch_on_device
from .inference import inference_device

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def normalise_caption(text: str) -> str:
    """A text (caption, passage, question, answer) in lower case, punctuation as words of their own, single
    spaces: one word per token of `build_word_tokenizer`'s tokenizer."""
    return " ".join(re.sub(r"([.,!?;:\"()])", r" \1 ", text.lower()).split())


def build_word_tokenizer(
    texts: list[str], extra_tokens: tuple[str, ...] = ()
) -> transformers.PreTrainedTokenizerFast:
    """A word-level tokenizer of the words of `texts` (split on whitespace: one token per word), with
    `<pad>`, `<s>` (the decoder's start), `</s>`, `<unk>` and `extra_tokens` (e.g. separators)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted({word for text in texts for word in text.split()} - set(extra_tokens))
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS.values(), *extra_tokens, *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **SPECIAL_TOKENS)


def start_and_end(tokenizer) -> tuple[int, int]:
    """`(decoder start id, end id)`: BOS (or CLS) and EOS (or SEP)."""
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id
    end = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    if start is None or end is None:
        raise ValueError("the decoder's tokenizer has no BOS/CLS or no EOS/SEP token to start and end texts")
    return start, end


def model_paths(config) -> tuple[str, str | None]:
    """`(encoder folder or Hub id, decoder folder or Hub id, or None for a scratch-* decoder)`."""
    decoder = None if config.decoder in SCRATCH_DECODERS else resolve_model(config.decoder)
    return resolve_model(config.encoder), decoder


def decoder_config(config, decoder_path: str | None, tokenizer):
    """The decoder's config with cross-attention asked for (`is_decoder`, `add_cross_attention`): the
    pretrained decoder's, or a `scratch-gpt2` / `scratch-bert` one of `config`'s `decoder_*` size with
    `config.decoder_positions` positions and the tokenizer's vocabulary and start, end and pad ids."""
    cross = {"is_decoder": True, "add_cross_attention": True}
    if decoder_path is not None:
        return AutoConfig.from_pretrained(decoder_path, **cross)
    start, end = start_and_end(tokenizer)
    sizes = {"vocab_size": len(tokenizer), "bos_token_id": start, "eos_token_id": end, **cross}
    sizes["pad_token_id"] = tokenizer.pad_token_id
    dropout, positions = config.decoder_dropout, config.decoder_positions
    if config.decoder == "scratch-gpt2":
        return transformers.GPT2Config(
            n_positions=positions,
            n_embd=config.decoder_hidden_size,
            n_layer=config.decoder_layers,
            n_head=config.decoder_heads,
            resid_pdrop=dropout,
            embd_pdrop=dropout,
            attn_pdrop=dropout,
            **sizes,
        )
    return transformers.BertConfig(
        hidden_size=config.decoder_hidden_size,
        num_hidden_layers=config.decoder_layers,
        num_attention_heads=config.decoder_heads,
        intermediate_size=4 * config.decoder_hidden_size,
        max_position_embeddings=positions,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        **sizes,
    )


def assemble_model(encoder, decoder, tokenizer) -> VisionEncoderDecoderModel:
    """`VisionEncoderDecoderModel(encoder, decoder)` with the tokenizer's start, end and pad ids."""
    model = VisionEncoderDecoderModel(encoder=encoder, decoder=decoder)
    start, end = start_and_end(tokenizer)
    for target in (model.config, model.generation_config):
        target.decoder_start_token_id, target.eos_token_id = start, end
        target.pad_token_id, target.bos_token_id = tokenizer.pad_token_id, start
    return model


def check_encoder_decoder(config, encoder_path: str, decoder_path: str | None, tokenizer, reads: str) -> None:
    """`ValueError` before anything trains: an encoder that is not a vision model or whose patches do not
    tile `image_size`, a decoder without cross-attention (it could not read `reads`), a gate that touches the
    encoder (its features are computed once) or that cannot patch this model (`patch` on a weightless copy,
    `backend` included)."""
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
        model = assemble_model(AutoModel.from_config(encoder_config), decoder, tokenizer)
        kinds = {block.kind for block in find_attention(model) if block.name.startswith("decoder.")}
        if "cross" not in kinds:
            raise ValueError(
                f"decoder {config.decoder!r} ({decoder_cfg.model_type}) has no cross-attention: it cannot "
                f"read {reads}. Use scratch-gpt2, scratch-bert, or a pretrained decoder whose config takes "
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


def build_encoder_decoder(config, encoder_path: str, decoder_path: str | None, tokenizer, run: RunSpec):
    """The model of `run`: the pretrained encoder (frozen), the decoder (from scratch, or pretrained, its
    embeddings grown to tokens the tokenizer added) and the projection between them drawn from
    `config.seed` (the same for every run), then the run's gate."""
    set_seed(config.seed)
    encoder = AutoModel.from_pretrained(encoder_path, dtype=torch.float32)
    decoder_cfg = decoder_config(config, decoder_path, tokenizer)
    if decoder_path is None:
        decoder = AutoModelForCausalLM.from_config(decoder_cfg)
    else:
        decoder = AutoModelForCausalLM.from_pretrained(decoder_path, config=decoder_cfg, dtype=torch.float32)
        if len(tokenizer) > decoder.get_input_embeddings().num_embeddings:
            decoder.resize_token_embeddings(len(tokenizer))
    set_seed(config.seed)
    model = assemble_model(encoder, decoder, tokenizer)
    model.set_attn_implementation(config.attn_implementation)
    model.encoder.requires_grad_(False)
    if run.gate is not None:
        set_seed(config.seed)
        patch_on_device(model, run.gate, config.backend)
    return model


def load_trained(config, run: RunSpec, attn_implementation: str | None = None) -> VisionEncoderDecoderModel:
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
    return model.to(inference_device()).eval()


def load_image_processor(encoder_path: str, image_size: int):
    """The encoder's image processor, resizing to `image_size` x `image_size` (no crop)."""
    processor = load_processor(encoder_path, transformers.AutoImageProcessor)
    processor.size = {"height": image_size, "width": image_size}
    processor.do_center_crop = False
    return processor


def patch_grid(encoder_path: str, image_size: int) -> int:
    """Patches per side of the encoder's grid at `image_size`."""
    return image_size // checkpoint_config(encoder_path).patch_size


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


def cached_features(
    path: Path,
    encoder_path: str,
    processor,
    images: dict[str, list],
    metadata: dict[str, str],
    batch_size: int,
) -> dict[str, torch.Tensor]:
    """`{split: (n, tokens, hidden) float16}` of `images[split]`, read from `path` when its metadata equals
    `metadata` (the splits' fingerprints, the encoder, the image size), else computed by the frozen encoder
    and saved there."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    if path.is_file():
        try:
            with safe_open(str(path), "pt") as f:
                if f.metadata() == metadata:
                    return {split: f.get_tensor(split) for split in images}
        except Exception as err:  # a truncated file: computed again
            logger.warning("%s unreadable (%s); computing the features again", path, err)
    encoder = AutoModel.from_pretrained(encoder_path, dtype=torch.float32).eval()
    encoder.set_attn_implementation("sdpa")
    features = {
        split: compute_features(encoder, processor, split_images, batch_size, split)
        for split, split_images in images.items()
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file({k: v.contiguous() for k, v in features.items()}, str(tmp), metadata=metadata)
    Path(tmp).replace(path)
    return features


def encoder_outputs(features: torch.Tensor, device) -> BaseModelOutput:
    return BaseModelOutput(last_hidden_state=features.to(device=device, dtype=torch.float32))
