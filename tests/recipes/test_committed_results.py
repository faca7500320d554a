"""The committed Markdown reports are what their commands write from the committed results folders (a change
of a report writer, or of a results folder, that the committed report does not follow fails here); the
committed comparison tables are what the recipes' `tables` action writes from the saved comparison.json (a
hand-edited table, or a changed table writer whose tables were not regenerated, fails here)."""

import os
import shutil
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


# every committed comparison table: the recipe whose `tables` action writes it, and its results folder
COMPARISON_TABLES = [
    ("summarization", "results/reproduce"),
    ("distillation", "results/distill"),
    ("classification", "results/classify-text"),
    ("classification", "results/classify-image"),
]


@pytest.mark.parametrize("recipe, results", COMPARISON_TABLES)
def test_committed_tables_are_what_the_tables_action_writes(recipe, results, tmp_path, capsys):
    """`hf-gate-attention recipe RECIPE tables RESULTS`, run on a copy holding only comparison.json, writes
    the committed comparison.md and comparison.csv byte for byte; the recipe's README names that command."""
    copy = tmp_path / results
    copy.mkdir(parents=True)
    shutil.copyfile(ROOT / results / "comparison.json", copy / "comparison.json")
    assert main(["recipe", recipe, "tables", str(copy)]) == 0
    assert capsys.readouterr().out == f"Wrote {copy / 'comparison.md'} and {copy / 'comparison.csv'}\n"
    for name in ("comparison.md", "comparison.csv"):
        assert (copy / name).read_bytes() == (ROOT / results / name).read_bytes(), (
            f"{results}/{name} is not what `hf-gate-attention recipe {recipe} tables {results}` writes"
        )
    readme = (ROOT / "recipes" / recipe / "README.md").read_text(encoding="utf-8")
    assert f"hf-gate-attention recipe {recipe} tables {results}" in readme


@pytest.mark.parametrize(
    "recipe, results, expected",
    [
        ("summarization", "missing", "{results} is not a folder; expected the results folder of a"),
        ("summarization", "empty", "{results} holds no comparison.json; expected the results folder of a"),
        (
            "summarization",
            "results/distill",
            "{results}/comparison.json is not a comparison of the summarization recipe (its config has keys",
        ),
        (
            "distillation",
            "results/reproduce",
            "{results}/comparison.json is not a comparison of the distillation recipe (its config has keys",
        ),
        (
            "classification",
            "results/reproduce",
            "{results}/comparison.json is not a comparison of the classification recipe (its config has keys",
        ),
    ],
)
def test_the_tables_action_refuses_what_is_not_its_recipes_results(
    recipe, results, expected, tmp_path, capsys, monkeypatch
):
    """Bad input is one line naming the file and what is expected, exit status 2, and nothing written."""
    monkeypatch.chdir(ROOT)
    if results in ("missing", "empty"):
        results = str(tmp_path / results)
        if results.endswith("empty"):
            os.mkdir(results)
    tables = [ROOT / results / name for name in ("comparison.md", "comparison.csv")]
    before = [table.stat().st_mtime_ns for table in tables if table.exists()]
    assert main(["recipe", recipe, "tables", results]) == 2
    error = capsys.readouterr().err
    prefix = f"hf-gate-attention recipe {recipe} tables: error: "
    assert error.startswith(prefix + expected.format(results=results)) and error.count("\n") == 1
    assert f"expected the results folder of a `hf-gate-attention recipe {recipe}` comparison" in error
    assert [table.stat().st_mtime_ns for table in tables if table.exists()] == before


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
