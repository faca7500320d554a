"""What the recipes with a frozen vision encoder and a text decoder with cross-attention share (captioning,
video QA): the word-level tokenizer, a decoder built from scratch, the assembled `VisionEncoderDecoderModel`,
the check that the decoder reads the encoder, the image processor, and the encoder features computed once and
cached in a safetensors file."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import torch
import transformers
from transformers import AutoModel, VisionEncoderDecoderModel
from transformers.modeling_outputs import BaseModelOutput

from ...core.families import find_attention
from ...sharing.loading import checkpoint_config, load_processor

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
SCRATCH_DECODERS = ("scratch-gpt2", "scratch-bert")


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


def scratch_decoder_config(config, vocab_size: int, positions: int, tokens: dict, cross: dict):
    """The config of a `scratch-gpt2` / `scratch-bert` decoder of `config`'s `decoder_*` size."""
    dropout = config.decoder_dropout
    if config.decoder == "scratch-gpt2":
        return transformers.GPT2Config(
            vocab_size=vocab_size,
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
        vocab_size=vocab_size,
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


def assemble_model(encoder, decoder, tokenizer) -> VisionEncoderDecoderModel:
    """`VisionEncoderDecoderModel(encoder, decoder)` with the tokenizer's start, end and pad ids."""
    model = VisionEncoderDecoderModel(encoder=encoder, decoder=decoder)
    start, end = start_and_end(tokenizer)
    for target in (model.config, model.generation_config):
        target.decoder_start_token_id, target.eos_token_id = start, end
        target.pad_token_id, target.bos_token_id = tokenizer.pad_token_id, start
    return model


def require_cross_attention(model, decoder: str, model_type: str, reads: str) -> None:
    """`ValueError` when the assembled model's decoder has no cross-attention block (cannot read `reads`)."""
    kinds = {block.kind for block in find_attention(model) if block.name.startswith("decoder.")}
    if "cross" not in kinds:
        raise ValueError(
            f"decoder {decoder!r} ({model_type}) has no cross-attention: it cannot read {reads}. Use "
            "scratch-gpt2, scratch-bert, or a pretrained decoder whose config takes add_cross_attention=True "
            "(GPT-2, BERT, RoBERTa, ...)"
        )


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
