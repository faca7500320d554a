"""The package's rooms and the direction of their imports (see docs/architecture.md).

Imports, at module level and inside functions, flow one way: core -> kernels -> sharing -> recipes ->
cli/demo/serving, with `diagnostics` (core + helpers only) usable from the recipes and the command line, and
the small shared helpers (`files`, `formatting`, `claims`, `known_models`, `memory`, `offline`, `plotting`,
`version`) from any room above the core; no module reaches itself through imports. `core` imports only torch,
transformers and itself: what runs above it registers into it (the kernels' backends into `core.backends`,
the `save_pretrained`/`push_to_hub` bound on patched instances into `core.patching`, by the package root).
The recipes are peers standing on `recipes.common`: none imports another, and `common` imports none.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

PACKAGE = REPO / "hf_gate_attention"
# room -> the rooms its module-level imports may reach
ALLOWED = {
    "core": {"core"},
    "kernels": {"kernels", "core"},
    "helpers": {"helpers"},
    "diagnostics": {"diagnostics", "core", "helpers"},
    "sharing": {"sharing", "kernels", "core", "helpers"},
    "recipes": {"recipes", "diagnostics", "sharing", "kernels", "core", "helpers"},
    "top": {"top", "recipes", "diagnostics", "sharing", "kernels", "core", "helpers"},
}
HELPERS = {"files", "formatting", "claims", "known_models", "memory", "offline", "plotting", "version"}


def _room(module: str) -> str:
    """`hf_gate_attention.sharing.card` -> `sharing`; the package root, `cli`, `demo`, `serving` -> `top`."""
    parts = module.split(".")[1:]
    if not parts or parts[0] in ("cli", "demo", "serving", "__main__"):
        return "top"
    return "helpers" if parts[0] in HELPERS else parts[0]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "rouge_metric" not in p.parts)
NAMES = {_module_name(p) for p in MODULES}


def imports(path: Path) -> set[str]:
    """The hf_gate_attention modules that `path` imports, at module level or inside functions (relative
    imports resolved; `from package import module` names the module, `from module import name` the module)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in NAMES else base for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m == "hf_gate_attention" or m.startswith("hf_gate_attention.")}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_flow_one_way_even_inside_functions(path):
    room = _room(_module_name(path))
    for imported in imports(path):
        assert _room(imported) in ALLOWED[room], f"{_module_name(path)} ({room}) imports {imported}"


def _recipe(module: str) -> str | None:
    """`hf_gate_attention.recipes.distillation.train` -> `distillation` (`common` for the shared package);
    `None` outside a recipe's package (the package root, `recipes.registry`)."""
    parts = module.split(".")
    if parts[1:2] != ["recipes"] or len(parts) < 3 or not (PACKAGE / "recipes" / parts[2]).is_dir():
        return None
    return parts[2]


RECIPE_MODULES = [p for p in MODULES if _recipe(_module_name(p))]


@pytest.mark.parametrize("path", RECIPE_MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_recipes_import_common_and_never_each_other(path):
    mine = _recipe(_module_name(path))
    for imported in imports(path):
        theirs = _recipe(imported)
        allowed = {mine, None} | ({"common"} if mine != "common" else set())
        assert theirs in allowed, f"{_module_name(path)} ({mine}) imports {imported} ({theirs})"


def test_no_import_circles():
    """No module reaches itself through imports, counting those inside functions (a depth-first search over
    the package's import graph)."""
    graph = {_module_name(path): sorted(imports(path) & NAMES) for path in MODULES}
    circles, state, stack = [], {}, []

    def visit(module: str) -> None:
        state[module] = "open"
        stack.append(module)
        for imported in graph[module]:
            if state.get(imported) == "open":
                circles.append(" -> ".join([*stack[stack.index(imported) :], imported]))
            elif imported not in state:
                visit(imported)
        stack.pop()
        state[module] = "done"

    for module in graph:
        if module not in state:
            visit(module)
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_every_room_says_what_it_is_for():
    for path in MODULES:
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        assert docstring, f"{path.relative_to(PACKAGE)} has no module docstring"


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


BLOCK_RECIPE_STACK = """
import sys
# pyyaml, also in the [recipes] extra, stays: huggingface_hub (a transformers dependency) needs it
for name in ("accelerate", "datasets", "evaluate", "rouge_score", "matplotlib"):
    sys.modules[name] = None  # `import name` raises ImportError, find_spec(name) is None: not installed
"""


def test_the_core_works_without_the_recipe_stack_and_loads_nothing_else():
    done = _python(
        BLOCK_RECIPE_STACK
        + """
import torch, transformers
import hf_gate_attention
config = transformers.LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=20, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=8)
model = hf_gate_attention.patch(transformers.LlamaForCausalLM(config), variant="qk")
model(torch.tensor([[1, 2, 3]]))
hf_gate_attention.unpatch(model)
ours = sorted(m for m in sys.modules if m.startswith("hf_gate_attention.") and not m.endswith(".version"))
print(ours)
# the kernels register their backends (Triton itself is not imported); nothing of sharing or the recipes loads
# (beyond the package version)
assert all(m.startswith(("hf_gate_attention.core", "hf_gate_attention.kernels")) for m in ours), ours
"""
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_recipe_without_its_extra_names_the_extra():
    done = _python(BLOCK_RECIPE_STACK + "import hf_gate_attention.recipes.summarization\n")
    assert done.returncode != 0
    command = _python(
        BLOCK_RECIPE_STACK + "from hf_gate_attention import cli\nsys.exit(cli.main(['summarize']))\n"
    )
    assert command.returncode == 2, command.stderr[-3000:]
    assert command.stderr.startswith(
        "hf-gate-attention summarize: error: the hf-gate-attention recipes need the [recipes]"
    )
    assert (
        "ImportError: the hf-gate-attention recipes need the [recipes] extra; missing: accelerate"
        in done.stderr
    )
    recipe = _python(
        BLOCK_RECIPE_STACK
        + "from hf_gate_attention import cli\nsys.exit(cli.main(['recipe', 'pretraining']))\n"
    )
    assert recipe.returncode == 2, recipe.stderr[-3000:]
    assert recipe.stderr.startswith("hf-gate-attention recipe: error: the hf-gate-attention recipes need")
    assert "pip install 'hf-gate-attention[recipes]'" in done.stderr


def test_sharing_names_are_imported_on_first_use():
    done = _python(
        "import sys, hf_gate_attention as h\n"
        "assert 'hf_gate_attention.sharing.hub' not in sys.modules\n"
        "assert h.push_to_hub.__module__ == 'hf_gate_attention.sharing.hub'\n"
        "assert set(h.__all__) <= set(dir(h))\n"
        "try:\n    h.no_such_name\nexcept AttributeError as e:\n    print(e)\n"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "has no attribute 'no_such_name'" in done.stdout
