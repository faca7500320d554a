"""`push_to_hub` end to end: the real `huggingface_hub` client against a local fake Hub (hub_server.py).

The upload runs in this process with the client's endpoint constants patched; the download runs in a fresh
interpreter with `HF_ENDPOINT` set, because `huggingface_hub` and transformers read it at import time.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
import transformers
from helpers import REPO, tiny_model
from hub_server import TOKEN, FakeHub
from huggingface_hub import ModelCard, constants
from huggingface_hub.errors import LocalTokenNotFoundError
from tokenizers import Tokenizer, models, pre_tokenizers

import hf_gate_attention
from hf_gate_attention.sharing import card
from hf_gate_attention.sharing.hub import DEFAULT_COMMIT_MESSAGE, push_to_hub

REPO_ROOT = REPO


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A running fake Hub that this process's `huggingface_hub` client talks to, without a saved token."""
    with FakeHub(tmp_path / "hub") as server:
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)  # the server speaks basic LFS only
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
        monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(tmp_path / "agent_harnesses.json"))
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
            monkeypatch.delenv(name, raising=False)
        yield server


@pytest.fixture
def card_calls(monkeypatch):
    """The keyword arguments of each `write_model_card` call; the real writer runs."""
    calls = []
    real = card.write_model_card

    def spy(folder, **kwargs):
        calls.append(kwargs)
        return real(folder, **kwargs)

    monkeypatch.setattr(card, "write_model_card", spy)
    return calls


def tiny_gated_model(seed: int = 0):
    model = tiny_model("llama", seed=seed)
    # init="paper": gates about 0.5, so a model loaded without them would give different logits
    return hf_gate_attention.patch(model, hf_gate_attention.GateConfig(variant="output", init="paper"))


def tiny_tokenizer():
    vocab = {token: i for i, token in enumerate(["<pad>", "<s>", "</s>", "<unk>", "gated", "attention", "."])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def folder_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def client_env(hub: FakeHub, home: Path, token: str | None = None) -> dict[str, str]:
    """The environment of a fresh interpreter whose `huggingface_hub` talks to `hub` only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_", "TRANSFORMERS_"))}
    env.update(
        HF_ENDPOINT=hub.url,
        HF_HUB_OFFLINE="0",
        HF_HOME=str(home),
        HF_HUB_DISABLE_XET="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    if token:
        env["HF_TOKEN"] = token
    return env


_DOWNLOAD = """
import sys, huggingface_hub, torch, transformers, hf_gate_attention
repo_id, expected_file = sys.argv[1:]
expected = torch.load(expected_file)
model = hf_gate_attention.from_pretrained(repo_id, attn_implementation="eager").eval()
with torch.no_grad():
    logits = model(expected["input_ids"]).logits
tokenizer = transformers.AutoTokenizer.from_pretrained(repo_id)
try:
    huggingface_hub.model_info(repo_id, token=False)
    anonymous = "allowed"
except huggingface_hub.errors.RepositoryNotFoundError:
    anonymous = "refused"
torch.save({"logits": logits, "ids": tokenizer("gated attention .")["input_ids"], "anonymous": anonymous},
           expected_file + ".out")
"""


@pytest.mark.slow
def test_push_model_round_trip(hub, card_calls, tmp_path):
    model, tokenizer = tiny_gated_model(), tiny_tokenizer()
    info = push_to_hub(
        model,
        "alice/tiny-gated",
        processor=tokenizer,
        private=True,
        commit_message="first push",
        token=TOKEN,
    )

    local = tmp_path / "local"
    model.save_pretrained(local)
    tokenizer.save_pretrained(local)
    uploaded = hub.files("alice/tiny-gated")
    assert set(uploaded) == set(folder_files(local)) | {"README.md"}
    assert {k: v for k, v in uploaded.items() if k != "README.md"} == folder_files(local)
    assert uploaded["README.md"].decode() == str(card.render_model_card(local, repo_id="alice/tiny-gated"))
    assert card_calls == [
        {"results": None, "run": None, "base_model": None, "datasets": None, "repo_id": "alice/tiny-gated"}
    ]

    (commit,) = hub.commits
    assert commit["summary"] == "first push" and commit["revision"] == "main" and not commit["create_pr"]
    assert commit["files"]["model.safetensors"] == "lfs" and commit["files"]["config.json"] == "regular"
    assert hub.lfs_uploads == [hashlib.sha256(uploaded["model.safetensors"]).hexdigest()]
    assert hub.repos["alice/tiny-gated"].private
    assert info.oid == hub.head("alice/tiny-gated") and info.repo_url.repo_id == "alice/tiny-gated"

    input_ids = torch.randint(3, 99, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(input_ids).logits
    expected_file = tmp_path / "expected.pt"
    torch.save({"input_ids": input_ids}, expected_file)
    subprocess.run(
        [sys.executable, "-c", _DOWNLOAD, "alice/tiny-gated", str(expected_file)],
        env=client_env(hub, tmp_path / "client-home", token=TOKEN),
        cwd=REPO_ROOT,
        check=True,
    )
    out = torch.load(f"{expected_file}.out")
    assert torch.equal(out["logits"], logits)
    assert out["ids"] == tokenizer("gated attention .")["input_ids"]
    assert out["anonymous"] == "refused"  # private repo
    assert ("GET", "/alice/tiny-gated/resolve/" + info.oid + "/model.safetensors") in hub.requests


def test_push_folder_to_branch_and_pr(hub, monkeypatch, tmp_path):
    card_calls = []

    def fake_card(folder, **kwargs):
        card_calls.append(kwargs)
        (Path(folder) / "README.md").write_text("# card\n")
        return Path(folder) / "README.md"

    monkeypatch.setattr(card, "write_model_card", fake_card)
    folder = tmp_path / "saved"
    tiny_gated_model().save_pretrained(folder)
    before = folder_files(folder)

    info = push_to_hub(
        folder,
        "alice/folder",
        results="results/demo",
        run="g1",
        base_model="org/base",
        datasets=["org/data"],
        revision="dev",
        commit_message="to dev",
        commit_description="why",
        token=TOKEN,
    )
    assert folder_files(folder) == before  # no card written into the user's folder
    uploaded = hub.files("alice/folder", "dev")
    assert set(uploaded) == set(before) | {"README.md"}
    assert {k: v for k, v in uploaded.items() if k != "README.md"} == before
    assert hub.files("alice/folder", "main") == {}
    assert not hub.repos["alice/folder"].private
    assert ("POST", "/api/models/alice/folder/branch/dev") in hub.requests
    assert hub.commits[-1] | {"files": None, "oid": None} == {
        "repo_id": "alice/folder",
        "revision": "dev",
        "summary": "to dev",
        "description": "why",
        "create_pr": False,
        "files": None,
        "oid": None,
    }
    assert info.oid == hub.head("alice/folder", "dev")
    assert card_calls == [
        {
            "results": "results/demo",
            "run": "g1",
            "base_model": "org/base",
            "datasets": ["org/data"],
            "repo_id": "alice/folder",
        }
    ]

    # a folder with its own README.md is uploaded as it is, as a pull request on main
    (folder / "README.md").write_text("# my own card\n")
    info = push_to_hub(str(folder), "alice/folder", create_pr=True, token=TOKEN)
    assert len(card_calls) == 1
    assert info.pr_url is not None and info.pr_num == 1
    assert hub.commits[-1]["revision"] == "refs/pr/1" and hub.commits[-1]["create_pr"]
    assert hub.commits[-1]["summary"] == DEFAULT_COMMIT_MESSAGE
    assert hub.files("alice/folder", "refs/pr/1") == folder_files(folder)


def test_no_token_fails_before_any_request(hub, card_calls):
    with pytest.raises(LocalTokenNotFoundError, match=r"no Hugging Face token.*hf auth login"):
        push_to_hub(tiny_gated_model(), "alice/no-token")
    assert hub.requests == [] and card_calls == []


def test_rejects_ungated_input(hub, card_calls, tmp_path):
    model = tiny_gated_model()
    hf_gate_attention.unpatch(model)
    with pytest.raises(ValueError, match="not patched with gated attention"):
        push_to_hub(model, "alice/plain", token=TOKEN)
    model.save_pretrained(tmp_path / "plain")
    with pytest.raises(ValueError, match="not a gated checkpoint"):
        push_to_hub(tmp_path / "plain", "alice/plain", token=TOKEN)
    with pytest.raises(ValueError, match=r"no config\.json"):
        push_to_hub(tmp_path, "alice/plain", token=TOKEN)
    assert hub.requests == [] and card_calls == []


def test_server_refuses_writes_without_token(hub):
    request = urllib.request.Request(
        f"{hub.url}/api/repos/create", data=json.dumps({"name": "x", "organization": "alice"}).encode()
    )
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(request)
    assert error.value.code == 401 and hub.repos == {}


def test_model_push_to_hub_method_takes_transformers_keywords(hub, card_calls):
    model = tiny_gated_model()
    transformers_keywords = set(inspect.signature(transformers.PreTrainedModel.push_to_hub).parameters)
    assert transformers_keywords - {"self"} <= set(inspect.signature(push_to_hub).parameters)
    info = model.push_to_hub(
        "alice/method",
        private=True,
        commit_message="from the model",
        commit_description="details",
        tags=["summarization", "gated-attention"],
        max_shard_size="1MB",
        token=TOKEN,
    )
    assert hub.commits[-1]["summary"] == "from the model" and hub.commits[-1]["description"] == "details"
    assert hub.repos["alice/method"].private and info.oid == hub.head("alice/method")
    tags = ModelCard(hub.files("alice/method")["README.md"].decode()).data.tags
    assert tags[-1] == "summarization" and tags.count("gated-attention") == 1 and "hf-gate-attention" in tags


def test_tags_reach_a_folders_own_card_in_the_upload_only(hub, tmp_path):
    folder = tmp_path / "saved"
    tiny_gated_model().save_pretrained(folder)
    (folder / "README.md").write_text("---\nlicense: mit\ntags:\n- mine\n---\n# my card\n")
    before = folder_files(folder)
    push_to_hub(folder, "alice/tagged", tags=["extra", "mine"], token=TOKEN)
    assert folder_files(folder) == before
    uploaded = ModelCard(hub.files("alice/tagged")["README.md"].decode())
    assert uploaded.data.tags == ["mine", "extra"] and uploaded.data.license == "mit"
    assert uploaded.text.strip() == "# my card"
    for bad in ("extra", [""], [3]):
        with pytest.raises(ValueError, match=r"tags=.*accepted: a list of non-empty strings"):
            push_to_hub(folder, "alice/tagged", tags=bad, token=TOKEN)


def test_cli_push_passes_tags_and_commit_description(hub, tmp_path):
    from hf_gate_attention.cli import main

    folder = tmp_path / "saved"
    tiny_gated_model().save_pretrained(folder)
    args = ["push", str(folder), "alice/cli", "--tag", "one", "--tag", "two", "--commit-description", "why"]
    assert main([*args, "--token", TOKEN]) == 0
    assert hub.commits[-1]["description"] == "why"
    assert ModelCard(hub.files("alice/cli")["README.md"].decode()).data.tags[-2:] == ["one", "two"]
