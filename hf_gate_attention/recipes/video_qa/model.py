"""The question answerer of a run: a `VisionEncoderDecoderModel` (frozen vision encoder, text decoder with
cross-attention) patched with the run's gate; its tokenizer, the checks made before anything trains, the
prompts (passage and question, read by self-attention), the clip's encoder states (its frames' cached
features side by side, read by cross-attention) and the collator.

The model is saved and loaded as a standard `VisionEncoderDecoderModel`; a clip goes in as
`encoder_outputs` (`clip_states`), since the encoder itself reads one image.
"""

from __future__ import annotations

import math

import torch

from ...sharing.loading import load_processor
from ..common.encoder_decoder import build_word_tokenizer, start_and_end
from .config import VideoQAConfig

QUESTION, ANSWER = "<q>", "<a>"  # the separators before the question and before the answer


def load_tokenizer(decoder_path: str | None, texts: list[str]):
    """A word-level tokenizer of `texts` for a `scratch-*` decoder, else the decoder's own; both with the
    separators `<q>` and `<a>`."""
    if decoder_path is None:
        return build_word_tokenizer(texts, (QUESTION, ANSWER))
    tokenizer = load_processor(decoder_path)
    tokenizer.add_special_tokens({"additional_special_tokens": [QUESTION, ANSWER]})
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.sep_token
    return tokenizer


def encode(tokenizer, config: VideoQAConfig, passage: str, question: str, answer: str | None = None):
    """`(prompt ids, answer ids + end)`: the prompt `<s> passage <q> question <a>` (passage and question
    truncated); the answer, when given, untruncated (`check_answers` refuses long ones)."""
    start, end = start_and_end(tokenizer)
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"] if text else []  # noqa: E731
    q, a = tokenizer.convert_tokens_to_ids([QUESTION, ANSWER])
    prompt = [
        start,
        *ids(passage)[: config.max_passage_tokens],
        q,
        *ids(question)[: config.max_question_tokens],
        a,
    ]
    return prompt, None if answer is None else [*ids(answer), end]


def check_answers(tokenizer, config: VideoQAConfig, data) -> None:
    """`ValueError` naming the first answer longer than `max_answer_tokens` tokens."""
    for split, clips in data.splits.items():
        for clip in clips:
            for q in clip["questions"]:
                count = len(encode(tokenizer, config, "", "", q["answer"])[1]) - 1
                if count > config.max_answer_tokens:
                    raise ValueError(
                        f"{split} clip {clip['id']}: answer {q['answer']!r} has {count} tokens; "
                        f"max_answer_tokens={config.max_answer_tokens} (answers are not truncated)"
                    )


# ------------------------------------------------------------------------------------ clips and batches


def frame_codes(frames: int, hidden: int) -> torch.Tensor:
    """`(frames, hidden)` fixed sinusoidal codes of the frame index (the order of the frames)."""
    position = torch.arange(frames, dtype=torch.float32)[:, None]
    rate = torch.exp(torch.arange(0, hidden, 2, dtype=torch.float32) * (-math.log(100.0) / hidden))
    codes = torch.zeros(frames, hidden)
    codes[:, 0::2] = torch.sin(position * rate)
    codes[:, 1::2] = torch.cos(position * rate)[:, : hidden // 2]
    return codes


def clip_states(features: torch.Tensor) -> torch.Tensor:
    """`(clips, frames, tokens, hidden)` frame features -> `(clips, frames * tokens, hidden)` float32 encoder
    states, each frame's tokens plus its frame code (so that cross-attention can tell the frames apart)."""
    clips, frames, tokens, hidden = features.shape
    states = features.float() + frame_codes(frames, hidden)[None, :, None, :]
    return states.reshape(clips, frames * tokens, hidden)


def question_rows(tokenizer, config: VideoQAConfig, data, split: str) -> list[dict]:
    """Training rows `{"split", "clip", "input_ids", "labels"}`: the prompt and answer, labels -100 except
    where the next token is an answer token or the end."""
    rows = []
    for q in data.questions(split):
        clip = data.splits[split][q["clip"]]
        prompt, answer = encode(tokenizer, config, clip["passage"], q["question"], q["answer"])
        ids = prompt + answer[:-1]
        labels = [-100] * (len(prompt) - 1) + answer
        rows.append({"split": split, "clip": q["clip"], "input_ids": ids, "labels": labels})
    return rows


class QACollator:
    """Rows of `question_rows` -> `{"encoder_outputs": ((batch, frames * tokens, hidden),),
    "decoder_input_ids", "decoder_attention_mask", "labels"}`, padded on the right."""

    def __init__(self, features: dict[str, torch.Tensor], pad_id: int):
        self.features, self.pad_id = features, pad_id  # {split: (clips, frames, tokens, hidden)}

    def __call__(self, rows: list[dict]) -> dict:
        length = max(len(row["input_ids"]) for row in rows)
        ids = torch.full((len(rows), length), self.pad_id, dtype=torch.long)
        labels = torch.full((len(rows), length), -100, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, row in enumerate(rows):
            mask[i, : len(row["input_ids"])] = 1
            ids[i, : len(row["input_ids"])] = torch.tensor(row["input_ids"])
            labels[i, : len(row["labels"])] = torch.tensor(row["labels"])
        states = clip_states(self.features[rows[0]["split"]][[row["clip"] for row in rows]])
        return {
            "encoder_outputs": (states,),
            "decoder_input_ids": ids,
            "decoder_attention_mask": mask,
            "labels": labels,
        }
