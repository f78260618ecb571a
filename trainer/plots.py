"""The one way this project draws a PNG: matplotlib on the Agg backend (no screen), saved at 100 dpi and closed.

Every plot (the run's own in trainer/run_plots.py, the runs side by side in trainer/curves.py, the evaluations'
in evals/plots.py) loads pyplot with `pyplot()` and writes with `save()`. matplotlib is a dependency, but a
plot is never worth a failed run: where it cannot be imported, `pyplot()` is None and no plot is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

DPI = 100


def pyplot() -> Any | None:
    """matplotlib's pyplot on the Agg backend, or None where matplotlib is not installed (no plot then)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save(fig: Any, path: Path) -> Path:
    """Lay `fig` out, write it to `path` as a PNG and close it (pyplot keeps every open figure otherwise)."""
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
