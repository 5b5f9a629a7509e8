"""Plots of a sweep folder (``fedsim sweep``): accuracy against ε over the arms, and each arm's
accuracy curve with the final accuracy ± std over seeds (``fedsim report SWEEP_DIR``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from fedsim.errors import writing
from fedsim.privacy.display import format_delta


def is_sweep(folder: str | Path) -> bool:
    """Whether ``folder`` is a sweep folder (it holds ``sweep.json`` and ``trials/``)."""
    return (Path(folder) / "sweep.json").is_file() and (Path(folder) / "trials").is_dir()


def _num(x: Any) -> float | None:
    """An ε from ``sweep.json`` as a float (``"inf"`` as ∞); None where the arm has none."""
    if x is None:
        return None
    return math.inf if x == "inf" else float(x)


def privacy_label(relation: str | None, delta: Any) -> str:
    """What an ε holds for, in words: the neighbouring relation (its human name,
    :data:`fedsim.privacy.accounting.RELATION_LABELS`) and δ (rounded up).

    Parameters
    ----------
    relation : the relation's name (``add_or_remove_one``, ``replace_one``, …); None if unknown.
    delta : the δ (a float, or None if unknown: a ``sweep.json`` from before δ was kept).
    """
    from fedsim.privacy.accounting import RELATION_LABELS

    words = "relation unknown" if relation is None else RELATION_LABELS.get(relation, relation)
    return f"{words}, δ = {format_delta(delta, none='unknown')}"


def plot_accuracy_vs_epsilon(folder: Path, result: dict[str, Any]) -> Path:
    """One point per arm (mean ± std of the metric over seeds) against its ε; arms without a finite ε
    (no noise) are drawn as a dashed line. An ε holds for a neighbouring relation and a δ: when
    every arm shares them, the x-axis says which; otherwise each point's label does. An arm
    without an ε (no trial finished as planned) is left out.

    Parameters
    ----------
    folder : the sweep folder (the figure is written there as ``accuracy_vs_epsilon.png``).
    result : its ``sweep.json``.
    """
    import matplotlib.pyplot as plt

    fig = accuracy_vs_epsilon_figure(result)
    path = folder / "accuracy_vs_epsilon.png"
    with writing(path):
        fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def accuracy_vs_epsilon_figure(result: dict[str, Any]) -> Any:
    """The figure of `plot_accuracy_vs_epsilon` (a matplotlib `Figure`, not saved; close it with
    `matplotlib.pyplot.close`), from a sweep's `sweep.json` as a dict."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = result["metric"]
    pct = 100.0 if metric.endswith("accuracy") else 1.0
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    shown = [a for a in result["arms"] if _num(a.get("epsilon")) is not None and a[metric] is not None]
    finite = [a for a in shown if math.isfinite(_num(a["epsilon"]) or 0.0)]
    kinds = {privacy_label(a.get("neighboring_relation"), a.get("delta")) for a in finite}
    shared = len(kinds) == 1
    for arm in finite:
        where = "" if shared else f" ({privacy_label(arm.get('neighboring_relation'), arm.get('delta'))})"
        ax.errorbar(
            float(arm["epsilon"]),
            arm[metric] * pct,
            yerr=(arm[f"{metric}_std"] or 0.0) * pct,
            marker="o",
            capsize=3,
            label=f"{arm['arm']}{where}",
        )
    for arm in (a for a in shown if a not in finite):
        ax.axhline(arm[metric] * pct, ls="--", lw=1, color="grey", label=f"{arm['arm']} (ε = ∞)")
    if not finite:
        ax.set_xlabel("ε (no finite ε)")
    elif shared:
        ax.set_xlabel(f"ε ({kinds.pop()})")
    else:
        ax.set_xlabel("ε (arms differ in relation or δ: see each label)")
    ax.set_ylabel(f"{metric}{' (%)' if pct == 100.0 else ''}, mean ± std over seeds")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
    return fig


def plot_arms(folder: Path, result: dict[str, Any]) -> Path:
    """``arms.png``: eval accuracy against the round per arm (mean over its trials) and each arm's
    final accuracy (mean ± std over seeds, from the table), labelled with the table's arm names.
    Only the trials the table aggregates (``sweep.json``'s ``trials``) are drawn.

    Parameters
    ----------
    folder : the sweep folder (its trials under ``trials/``; the figure is written there).
    result : its ``sweep.json``.
    """
    import matplotlib
    import numpy as np

    from fedsim.reporting.report import read_metrics

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = result["metric"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    try:
        for arm in result["arms"]:
            curves = []
            for t in (t for t in result["trials"] if t["arm"] == arm["arm"]):
                rows = read_metrics(folder / "trials" / t["trial"])
                curves.append(
                    {int(m["round"]): float(m["eval_accuracy"]) for m in rows if m.get("eval_accuracy") is not None}
                )
            rounds = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
            if rounds:
                mean = [float(np.mean([c[r] for c in curves])) for r in rounds]
                ax1.plot(rounds, mean, marker="o", markersize=3, label=arm["arm"])
        ax1.set_xlabel("round")
        ax1.set_ylabel("eval accuracy (mean over seeds)")
        ax1.grid(True, alpha=0.3)
        if ax1.get_lines():
            ax1.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize=7)
        arms = result["arms"]
        ys = np.arange(len(arms))
        ax2.barh(
            ys,
            [a[metric] or 0.0 for a in arms],
            xerr=[a.get(f"{metric}_std") or 0.0 for a in arms],
            capsize=3,
        )
        ax2.set_yticks(ys, [f"{a['arm']} ({a['seeds']}/{a.get('planned', a['seeds'])})" for a in arms], fontsize=7)
        ax2.set_xlabel(f"final {metric} (mean ± std over seeds; seeds done/planned)")
        ax2.grid(True, axis="x", alpha=0.3)
        path = folder / "arms.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100, bbox_inches="tight")
        return path
    finally:
        plt.close(fig)


def selection_line(folder: str | Path) -> str:
    """What choosing the best arm of the sweep in ``folder`` costs in privacy: ``sweep.json``'s
    selection note (the ε of releasing the selected model with its δ, relation and theorem, or
    "selection not accounted" and why; trials that ran not as planned), and the trials that did
    not finish (``missing``: the table's means are over the others)."""
    result = json.loads((Path(folder) / "sweep.json").read_text(encoding="utf-8"))
    line = str(result["selection"]["note"])
    missing = result.get("missing") or []
    if missing:
        line += (
            f"; {len(missing)} trial(s) did not finish ({', '.join(missing)}): their arms' rows are over the "
            "others; finish them with fedsim sweep SPEC --resume SWEEP_DIR"
        )
    return line


def plot_sweep(folder: str | Path) -> list[Path]:
    """Draw ``accuracy_vs_epsilon.png`` and ``arms.png`` (:func:`plot_arms`) into the sweep folder;
    returns the files written."""
    folder = Path(folder)
    result = json.loads((folder / "sweep.json").read_text(encoding="utf-8"))
    return [plot_accuracy_vs_epsilon(folder, result), plot_arms(folder, result)]
