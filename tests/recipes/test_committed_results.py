"""The committed Markdown reports are what their commands write from the committed results folders (a change
of a report writer, or of a results folder, that the committed report does not follow fails here)."""

import os
import subprocess
import sys

import pytest
from helpers import REPO

from hf_gate_attention.cli import main
from hf_gate_attention.recipes.distillation.report import distillation_report
from hf_gate_attention.recipes.summarization.reproduction import reproduction_report

ROOT = REPO


@pytest.mark.parametrize(
    "module, action, build, results, report",
    [
        (
            "hf_gate_attention.recipes.summarization.reproduction",
            "summarization reproduction",
            reproduction_report,
            "results/reproduce",
            "results/REPRODUCTION.md",
        ),
        (
            "hf_gate_attention.recipes.distillation.report",
            "distillation report",
            distillation_report,
            "results/distill",
            "results/DISTILLATION.md",
        ),
    ],
)
def test_committed_report_is_what_its_command_writes(module, action, build, results, report, monkeypatch):
    """The report is what one of its two commands (the module's, the recipe command's) writes; both work."""
    monkeypatch.chdir(ROOT)
    commands = [f"python -m {module}", f"hf-gate-attention recipe {action}"]
    written = [build(results, f"{command} {results} --out {report}") for command in commands]
    assert (ROOT / report).read_text(encoding="utf-8") in written


@pytest.mark.parametrize(
    "action, build, results",
    [
        (["summarization", "reproduction"], reproduction_report, "results/reproduce"),
        (["distillation", "report"], distillation_report, "results/distill"),
    ],
)
def test_the_recipe_command_writes_the_report_naming_itself(action, build, results, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "REPORT.md"
    assert main(["recipe", *action, results, "--out", str(out)]) == 0
    command = f"hf-gate-attention recipe {' '.join(action)} {results} --out {out}"
    assert out.read_text(encoding="utf-8") == build(results, command)


@pytest.mark.slow
@pytest.mark.parametrize(
    "module",
    [
        "hf_gate_attention.recipes.summarization.reproduction",
        "hf_gate_attention.recipes.summarization.diagnosis",  # results/diagnostics/DIAGNOSTICS.md
        "hf_gate_attention.recipes.distillation.report",
    ],
)
def test_the_commands_the_committed_results_name_still_run(module):
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    }
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: ")
