"""Writes that lose nothing: outputs that must not be replaced are refused, a replaced output is the old
complete version or the new one after a kill at any instant (a real save killed at random points), what a
killed write left is cleaned up by the next, and `save_pretrained` keeps the other files of its folder."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import make_tiny_model, tiny_model

import hf_gate_attention
from hf_gate_attention import gate_parameters, patch
from hf_gate_attention.cli import main
from hf_gate_attention.files import discard_set_aside, recover_output, replace_path, set_aside, staged_folder


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("writes") / "llama")


def test_patch_refuses_the_current_folder_its_parents_home_and_the_input(
    tiny_llama, tmp_path, monkeypatch, capsys
):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    for output, why in (
        (".", "current folder or one of its parents"),
        ("..", "current folder or one of its parents"),
        (str(tmp_path / "home"), "home folder"),
        (str(tiny_llama), "is the input"),
    ):
        assert main(["patch", str(tiny_llama), output, "--overwrite"]) == 2
        assert why in capsys.readouterr().err
    assert (work / "notes.txt").read_text() == "mine"
    assert {p.name for p in tiny_llama.iterdir()} >= {"config.json", "model.safetensors"}


def test_patch_refuses_a_gated_checkpoint(tiny_llama, tmp_path, capsys):
    gated = tmp_path / "gated"
    assert main(["patch", str(tiny_llama), str(gated), "--init", "paper"]) == 0
    before = {p.name: p.read_bytes() for p in gated.iterdir()}
    assert main(["patch", str(gated), str(tmp_path / "again")]) == 2
    assert "gated already" in capsys.readouterr().err
    assert not (tmp_path / "again").exists()
    assert {p.name: p.read_bytes() for p in gated.iterdir()} == before


def test_recover_output_restores_or_removes_what_a_killed_write_left(tmp_path):
    output = tmp_path / "out"
    # killed between the two renames of replace_path: only the old version, moved aside, exists
    aside = tmp_path / ".out.replaced.1"
    aside.mkdir()
    (aside / "weights").write_text("old")
    (tmp_path / ".out.staging.2").mkdir()  # and a staging folder of the new one
    recover_output(output)
    assert (output / "weights").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    # killed after both renames, before the old version was deleted
    (tmp_path / ".out.replaced.3").mkdir()
    recover_output(output)
    assert (output / "weights").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    # staged_folder cleans up first, then replaces
    with staged_folder(output, overwrite=True) as staging:
        (staging / "weights").write_text("new")
    assert (output / "weights").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    new = tmp_path / "file.new"
    new.write_text("2")
    replace_path(new, output)  # a file replaces a folder the same way
    assert output.read_text() == "2"


def _dead_pid() -> int:
    """The pid of a process that has ended (a child run and waited for)."""
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(child.stdout)


def test_a_later_write_in_the_same_folder_removes_what_killed_writers_left_but_not_live_ones(tmp_path):
    """Staging folders name their writer (`<pid>@<host>`): any later write in the parent folder removes
    those of writers that have ended, whatever output they were for; a live writer's stays, and so do
    those of another host and those that name no writer (unless they are for the output being written)."""
    host = socket.gethostname()
    dead = tmp_path / f".other.staging.{_dead_pid()}@{host}.abc123_x"
    live = tmp_path / f".third.staging.{os.getpid()}@{host}.abc123_y"
    remote = tmp_path / f".fourth.staging.{_dead_pid()}@not-{host}.abc123_z"
    unknown = tmp_path / ".fifth.staging.k2j3h4g5"
    for folder in (dead, live, remote, unknown):
        folder.mkdir()
        (folder / "model.safetensors").write_text("partial")
    with staged_folder(tmp_path / "out") as staging:
        (staging / "weights").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", live.name, remote.name, unknown.name])


def test_written_folders_follow_the_umask(tmp_path):
    """A saved folder gets the umask's mode, as transformers' `save_pretrained` gives it (not mkdtemp's
    0700): readable by a server running as another user with umask 022."""
    for umask, mode in ((0o022, 0o755), (0o077, 0o700), (0o002, 0o775)):
        previous = os.umask(umask)
        try:
            patch(tiny_model("llama")).save_pretrained(tmp_path / f"m{umask:o}")
        finally:
            os.umask(previous)
        assert (tmp_path / f"m{umask:o}").stat().st_mode & 0o777 == mode, f"umask {umask:o}"


def test_save_pretrained_keeps_the_folders_other_files_and_drops_stale_shards(tmp_path):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    (folder / "model-00002-of-00002.safetensors").write_text("stale")
    (folder / "notes").mkdir()
    (folder / "notes" / "run.txt").write_text("kept")
    model = patch(tiny_model("llama"), init="paper")
    model.save_pretrained(folder)
    names = {p.name for p in folder.iterdir()}
    assert {"tokenizer.json", "notes", "model.safetensors", "config.json"} <= names
    assert "model-00002-of-00002.safetensors" not in names
    assert (folder / "notes" / "run.txt").read_text() == "kept"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    with pytest.raises(ValueError, match="is a file"):
        model.save_pretrained(folder / "tokenizer.json")


# saves a patched tiny Llama over `folder` again and again, its gates alternating between two values, until
# killed; prints a line after its first complete save
SAVER = """
import sys, torch
sys.path.insert(0, sys.argv[2])
from helpers import tiny_model
from hf_gate_attention import gate_parameters, patch
model = patch(tiny_model("llama"), init="paper")
value = 0
while True:
    value = 1 - value
    with torch.no_grad():
        for param in gate_parameters(model):
            param.fill_(value)
    model.save_pretrained(sys.argv[1])
    print("saved", flush=True)
"""


@pytest.mark.slow
def test_a_save_killed_at_random_instants_leaves_the_old_or_the_new_checkpoint(tmp_path):
    folder = tmp_path / "checkpoint"
    tests = str(Path(__file__).parents[1])
    rng = random.Random(0)
    states = []
    for _ in range(8):
        process = subprocess.Popen(
            [sys.executable, "-c", SAVER, str(folder), tests], stdout=subprocess.PIPE, text=True
        )
        assert process.stdout.readline().strip() == "saved"
        time.sleep(rng.uniform(0.0, 0.3))  # a save of the tiny model takes about as long
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        recover_output(folder)  # what the next write does first
        model = hf_gate_attention.from_pretrained(str(folder))
        values = {round(p.float().mean().item(), 6) for p in gate_parameters(model)}
        assert values in ({0.0}, {1.0}), values  # one complete version, never a mix
        states.append(sorted(p.name for p in tmp_path.iterdir()))
    assert all(names == ["checkpoint"] for names in states)


def test_a_gate_adapter_is_written_as_one_version(tmp_path):
    """Saving a gate adapter over a folder holding a LoRA adapter and a note: the LoRA files of the previous
    save go (this adapter has none), the note stays, and nothing is left beside the folder."""
    folder = tmp_path / "adapter"
    folder.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors", "notes.md"):
        (folder / name).write_text("old")
    model = patch(tiny_model("llama"), init="paper")
    hf_gate_attention.save_gate_adapter(model, folder, base_model_name_or_path="org/base")
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["gate_adapter_config.json", "gate_adapter_model.safetensors", "notes.md"]
    assert (folder / "notes.md").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["adapter"]
    loaded = hf_gate_attention.load_gate_adapter(tiny_model("llama"), folder)
    for expected, got in zip(gate_parameters(model), gate_parameters(loaded), strict=True):
        assert expected.equal(got)


def test_a_missing_local_model_is_named_as_a_path(tmp_path, capsys):
    assert main(["patch", "./no/such/model", str(tmp_path / "out")]) == 2
    assert "model './no/such/model': no such file or folder" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------- unreadable files named


def _truncate(path: Path, drop: int = 40) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - drop])


def test_a_truncated_checkpoint_or_adapter_is_named(tmp_path, capsys):
    model = patch(tiny_model("llama"), init="paper")
    model.save_pretrained(tmp_path / "model")
    _truncate(tmp_path / "model" / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.safetensors is not a readable safetensors file"):
        hf_gate_attention.from_pretrained(str(tmp_path / "model"))

    adapter = tmp_path / "adapter"
    hf_gate_attention.save_gate_adapter(model, adapter, base_model_name_or_path="org/base")
    _truncate(adapter / "gate_adapter_model.safetensors", drop=8)
    with pytest.raises(ValueError, match=r"gate_adapter_model\.safetensors is not a readable safetensors"):
        hf_gate_attention.load_gate_adapter(tiny_model("llama"), adapter)
    (adapter / "gate_adapter_config.json").write_text('{"adapter_type": ')
    with pytest.raises(ValueError, match=r"gate_adapter_config\.json is not valid JSON \(truncated"):
        hf_gate_attention.load_gate_adapter(tiny_model("llama"), adapter)
    assert main(["info", str(adapter)]) == 2
    assert "gate_adapter_config.json is not valid JSON (truncated" in capsys.readouterr().err


def test_set_aside_keeps_the_old_results_until_the_new_are_complete(tmp_path, monkeypatch):
    results = tmp_path / "results" / "run"
    results.mkdir(parents=True)
    (results / "comparison.md").write_text("old")
    set_aside(results)
    assert not results.exists()
    (aside,) = (tmp_path / "results").iterdir()
    assert (aside / "comparison.md").read_text() == "old"
    recover_output(results)  # killed before the new folder was made: the old results come back
    assert (results / "comparison.md").read_text() == "old"

    set_aside(results)
    results.mkdir()  # the new run starts; killed here, the old results stay beside it
    (results / "comparison.md").write_text("new")
    discard_set_aside(results)
    assert [p.name for p in (tmp_path / "results").iterdir()] == ["run"]
    assert (results / "comparison.md").read_text() == "new"
    monkeypatch.chdir(results)
    with pytest.raises(ValueError, match="current folder"):
        set_aside(results)
