"""matplotlib on the Agg backend, imported on first use, and atomic PNG writes (the recipes' and the
diagnostics' plots)."""

from __future__ import annotations

import io
from pathlib import Path

from .files import atomic_write_bytes

MATPLOTLIB_INSTALL = "pip install matplotlib"


def pyplot():
    """`matplotlib.pyplot` on the Agg backend; `ModuleNotFoundError` with the install command without it."""
    try:
        import matplotlib
    except ImportError as err:
        raise ModuleNotFoundError(f"the plots need matplotlib: {MATPLOTLIB_INSTALL}") from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> None:
    """Write `fig` as PNG to `path` (atomically) and close it."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    pyplot().close(fig)
    atomic_write_bytes(path, buffer.getvalue())
