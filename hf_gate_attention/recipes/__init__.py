"""Library code of the recipes: `hf-gate-attention recipe NAME [--config FILE] [KEY=VALUE ...]` runs one
(`registry.py` lists them and their actions); they stand side by side on `common`.

The recipes need more than the core: the `[recipes]` extra (`pip install 'hf-gate-attention[recipes]'`).
Importing this package without it raises an `ImportError` that names the missing modules and the extra.
"""

from __future__ import annotations

import importlib.util

# import name -> distribution of the `[recipes]` extra
RECIPE_REQUIREMENTS = {
    "accelerate": "accelerate",
    "datasets": "datasets",
    "evaluate": "evaluate",
    "rouge_score": "rouge-score",
    "matplotlib": "matplotlib",
    "yaml": "pyyaml",
}


def missing_requirements() -> list[str]:
    """The distributions of the `[recipes]` extra that cannot be imported here."""
    return [dist for module, dist in RECIPE_REQUIREMENTS.items() if importlib.util.find_spec(module) is None]


_missing = missing_requirements()
if _missing:
    raise ImportError(
        f"the hf-gate-attention recipes need the [recipes] extra; missing: {', '.join(_missing)}. "
        "Install it with: pip install 'hf-gate-attention[recipes]'"
    )

from . import registry  # noqa: E402, F401 (registers the recipes' model card describers)
