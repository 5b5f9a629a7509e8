"""Plots of a sweep folder (``fedsim sweep``): accuracy against ε over the arms, and each arm's
accuracy curve with the final accuracy ± std over seeds (``fedsim report SWEEP_DIR``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def is_sweep(folder: str | Path) -> bool:
    """Whether ``folder`` is a sweep folder (it holds ``sweep.json`` and ``trials/``)."""
    return (Path(folder) / "sweep.json").is_file() and (Path(folder) / "trials").is_dir()


def _num(x: Any) -> float:
    return math.inf if x in ("inf", None) else float(x)


def plot_accuracy_vs_epsilon(folder: Path, result: dict[str, Any]) -> Path:
    """One point per arm (mean ± std of the metric over seeds) against its ε; arms without a finite ε
    (no noise) are drawn as a dashed line at the right edge."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = result["metric"]
    pct = 100.0 if metric.endswith("accuracy") else 1.0
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    finite = [a for a in result["arms"] if math.isfinite(_num(a["epsilon"])) and a[metric] is not None]
    for arm in finite:
        ax.errorbar(
            _num(arm["epsilon"]),
            arm[metric] * pct,
            yerr=(arm[f"{metric}_std"] or 0.0) * pct,
            marker="o",
            capsize=3,
            label=arm["arm"],
        )
    for arm in (a for a in result["arms"] if not math.isfinite(_num(a["epsilon"])) and a[metric] is not None):
        ax.axhline(arm[metric] * pct, ls="--", lw=1, color="grey", label=f"{arm['arm']} (ε = ∞)")
    ax.set_xlabel(f"ε ({finite[0]['neighboring_relation'] if finite else 'no finite ε'})")
    ax.set_ylabel(f"{metric}{' (%)' if pct == 100.0 else ''}, mean ± std over seeds")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
    path = folder / "accuracy_vs_epsilon.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def selection_line(folder: str | Path) -> str:
    """What choosing the best arm of the sweep in ``folder`` costs in privacy: ``sweep.json``'s
    selection note (the ε of releasing the selected model with its δ, relation and theorem, or
    "selection not accounted" and why)."""
    result = json.loads((Path(folder) / "sweep.json").read_text(encoding="utf-8"))
    return str(result["selection"]["note"])


def plot_sweep(folder: str | Path) -> list[Path]:
    """Draw ``accuracy_vs_epsilon.png`` and ``arms.png`` (per-arm curves, :func:`plot_ablation`)
    into the sweep folder; returns the files written."""
    from fedsim.report import plot_ablation

    folder = Path(folder)
    result = json.loads((folder / "sweep.json").read_text(encoding="utf-8"))
    runs = [folder / "trials" / t["trial"] for t in result["trials"]]
    return [plot_accuracy_vs_epsilon(folder, result), plot_ablation(runs, folder / "arms.png")]
