"""Push a gated model (or a folder saved from one) and its model card to the Hugging Face Hub."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from huggingface_hub import HfApi, ModelCard, get_token
from huggingface_hub.errors import LocalTokenNotFoundError

from ..core.hooks import CONFIG_ATTRIBUTE, unwrap_model
from ..core.patching import is_patched
from ..files import atomic_write_text, read_json

DEFAULT_COMMIT_MESSAGE = "Upload gated model (hf-gate-attention)"


def push_to_hub(
    model_or_folder,
    repo_id: str,
    *,
    processor=None,
    results=None,
    run=None,
    base_model: str | None = None,
    datasets=None,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
    commit_description: str | None = None,
    token: str | bool | None = None,
    create_pr: bool = False,
    max_shard_size: int | str = "50GB",
    tags: list[str] | None = None,
):
    """Upload a patched model, or a folder saved from one, with a model card; returns the `CommitInfo`.

    Takes every keyword of transformers' `PreTrainedModel.push_to_hub` (`commit_message`,
    `commit_description`, `private`, `token`, `revision`, `create_pr`, `max_shard_size`, `tags`), so a patched
    model's `model.push_to_hub(...)` accepts what users already pass.

    Args:
        model_or_folder: a model patched with `patch`, or the path of a folder written by the
            `save_pretrained` of one (its `config.json` has a `gate_attention` entry). A folder is uploaded as
            it is; the user's folder is never written to.
        repo_id (`str`): `"namespace/name"` (or `"name"` for your own namespace); created if missing.
        processor (*optional*): a tokenizer / image processor saved next to the model (model input only).
        results, run, base_model, datasets (*optional*): passed to `card.write_model_card` (`results`: the
            results folder of the recipe that trained the model) when the folder has no README.md.
        private, revision, commit_message, commit_description, create_pr: as in `HfApi.upload_folder`;
            `revision` is a branch, created from main if missing; `private` only applies to a new repo.
        token (`str`, *optional*): defaults to `huggingface_hub.get_token()` (`HF_TOKEN` or `hf auth login`).
        max_shard_size: passed to `save_pretrained` (model input only).
        tags (`list[str]`, *optional*): added to the card's metadata `tags` (after the card's own tags; also
            to a README.md the folder already has, in the uploaded copy only).
    """
    tags = checked_tags(tags)
    if isinstance(model_or_folder, (str, os.PathLike)):
        source = Path(model_or_folder)
        if processor is not None:
            raise ValueError("processor= is only used with a model; save it into the folder instead")
        _check_gated_folder(source)
    else:
        _check_model(model_or_folder)
    token = resolve_token(token)

    with tempfile.TemporaryDirectory(prefix="hf-gate-push-") as tmp:
        folder = Path(tmp)
        if isinstance(model_or_folder, (str, os.PathLike)):
            mirror(source, folder)
        else:
            model_or_folder.save_pretrained(folder, max_shard_size=max_shard_size)
            if processor is not None:
                processor.save_pretrained(folder)
        if not (folder / "README.md").exists():
            from .card import write_model_card

            write_model_card(
                folder, results=results, run=run, base_model=base_model, datasets=datasets, repo_id=repo_id
            )
        return upload(
            folder,
            repo_id,
            token=token,
            private=private,
            revision=revision,
            commit_message=commit_message or DEFAULT_COMMIT_MESSAGE,
            commit_description=commit_description,
            create_pr=create_pr,
            tags=tags,
        )


def checked_tags(tags) -> list[str]:
    if tags is None:
        return []
    if isinstance(tags, str) or not all(isinstance(tag, str) and tag.strip() for tag in tags):
        raise ValueError(
            f"tags={tags!r} is not valid; accepted: a list of non-empty strings, e.g. ['summarization']"
        )
    return list(tags)


def add_tags(card_file: Path, tags: list[str]) -> None:
    """Add `tags` to the metadata of the card at `card_file` (a file of the staging folder: a link to the
    user's own card is replaced, never written through)."""
    model_card = ModelCard.load(card_file)
    model_card.data.tags = list(dict.fromkeys([*(model_card.data.tags or []), *tags]))
    card_file.unlink()
    atomic_write_text(card_file, str(model_card))


def resolve_token(token: str | bool | None) -> str:
    """`token` if it is a non-empty string, else the saved one; else `LocalTokenNotFoundError`."""
    token = token if isinstance(token, str) and token else get_token()
    if not token:
        raise LocalTokenNotFoundError(
            "no Hugging Face token: pass token=... or run `hf auth login` / set HF_TOKEN"
        )
    return token


def upload(
    folder: Path,
    repo_id: str,
    *,
    token: str,
    private: bool | None,
    revision: str | None,
    commit_message: str,
    commit_description: str | None,
    create_pr: bool,
    tags: list[str] = (),
):
    """Create the repo (and the branch `revision`) if missing and upload `folder` in one commit, after adding
    `tags` (from `checked_tags`) to the metadata of its README.md."""
    if tags:
        add_tags(folder / "README.md", tags)
    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    if revision is not None and not revision.startswith("refs/pr/"):
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    return api.upload_folder(
        repo_id=repo_id,
        folder_path=folder,
        revision=revision,
        commit_message=commit_message,
        commit_description=commit_description,
        create_pr=create_pr,
    )


def _check_model(model) -> None:
    if not is_patched(model):
        raise ValueError(
            "this model is not patched with gated attention: patch it first (hf_gate_attention.patch), "
            "or push it with transformers' own model.push_to_hub"
        )
    if unwrap_model(model) is not model:
        raise ValueError(
            "this is a PEFT-wrapped model, whose save_pretrained writes only the adapter: "
            "push model.merge_and_unload() instead"
        )


def _check_gated_folder(folder: Path) -> None:
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{folder} is not a saved model folder: it has no config.json")
    if CONFIG_ATTRIBUTE not in read_json(config_file):
        raise ValueError(
            f"{folder} is not a gated checkpoint: its config.json has no {CONFIG_ATTRIBUTE!r} entry "
            "(save a patched model with save_pretrained)"
        )


def mirror(source: Path, target: Path) -> None:
    """Link every file of `source` into `target` (copy where links are not allowed): no bytes duplicated."""
    for path in source.rglob("*"):
        if path.is_file():
            destination = target / path.relative_to(source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            try:
                destination.symlink_to(path.resolve())
            except OSError:
                shutil.copy2(path, destination)
