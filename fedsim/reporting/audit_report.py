"""Plots and tables of text-audit folders (``fedsim audit --attack canary|user-inference``).

An audit folder holds ``audit.json``, ``user_inference.npz`` (the users' scores and the ROC
curve) and ``run/``; :func:`plot_text_audit` draws ``canary_exposure.png`` (exposure by
repetition level and canary data size, trained vs initial model) and ``user_inference_roc.png``
(the ROC curve on log axes), and :func:`format_text_audit` prints the numbers next to the
ledger's ε.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.errors import FedsimError
from fedsim.privacy.display import format_delta, format_epsilon


def is_text_audit(folder: str | Path) -> bool:
    """Whether ``folder`` is a text-audit folder (its ``audit.json`` says ``kind = text-audit``)."""
    path = Path(folder) / "audit.json"
    if not path.is_file():
        return False
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("kind") == "text-audit"
    except (OSError, ValueError):
        return False


def read_text_audit(folder: str | Path) -> dict[str, Any]:
    """The ``audit.json`` of a text-audit folder; :class:`FedsimError` when it is not one."""
    if not is_text_audit(folder):
        raise FedsimError(f"{folder} is not a text-audit folder (no audit.json of kind 'text-audit')")
    report: dict[str, Any] = json.loads((Path(folder) / "audit.json").read_text(encoding="utf-8"))
    return report


def _cell(level: dict[str, Any]) -> tuple[int, int | None]:
    """A canary level's cell: (repetitions r, donor data size; None = all)."""
    return int(level["repetitions"]), level.get("size")


def _cell_label(level: dict[str, Any], sized: bool) -> str:
    r, size = _cell(level)
    return f"r = {r}" if not sized else f"r = {r}, size {'all' if size is None else size}"


def _plot_exposure(ax: Any, canary: dict[str, Any]) -> None:
    levels = canary["by_level"]
    sized = len({_cell(lv)[1] for lv in levels}) > 1
    x = np.arange(len(levels))
    trained = [lv["mean_exposure"] for lv in levels]
    init = {_cell(lv): lv["mean_exposure"] for lv in canary.get("initial_model", [])}
    initial = [init.get(_cell(lv), np.nan) for lv in levels]
    ax.bar(x - 0.2, trained, 0.4, label="trained model")
    ax.bar(x + 0.2, initial, 0.4, label="initial model (chance)")
    for i, lv in enumerate(levels):
        pts = [c["exposure"] for c in canary["canaries"] if _cell(c) == _cell(lv)]
        ax.plot([x[i] - 0.2] * len(pts), pts, "k.", ms=4)
    ax.axhline(np.log2(canary["n_references"] + 1), color="grey", ls=":", lw=1, label="maximum (rank 1)")
    ax.set_xticks(x, [_cell_label(lv, sized) for lv in levels], fontsize=8 if sized else None)
    ax.set_ylabel("exposure (bits)")
    ax.set_title(f"secret-sharer canaries ({canary['n_references']} references)")
    ax.legend(fontsize=8)


def _plot_roc(ax: Any, arrays: Any, ui: dict[str, Any]) -> None:
    fpr, tpr = np.asarray(arrays["fpr"]), np.asarray(arrays["tpr"])
    floor = 1.0 / max(1, ui["held_out"]) / 2
    ax.plot(np.maximum(fpr, floor), np.maximum(tpr, floor), drawstyle="steps-post", label="user inference")
    grid = np.logspace(np.log10(floor), 0, 50)
    ax.plot(grid, grid, color="grey", ls=":", lw=1, label="chance")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    auc = ui["auc"]
    ax.set_title(f"AUC {auc['estimate']:.3f} [{auc['low']:.3f}, {auc['high']:.3f}]")
    ax.legend(fontsize=8, loc="lower right")


def plot_text_audit(folder: str | Path) -> list[Path]:
    """Draw the audit folder's plots; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    report = read_text_audit(folder)
    written = []
    if "canary" in report:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        _plot_exposure(ax, report["canary"])
        fig.savefig(folder / "canary_exposure.png", dpi=120, bbox_inches="tight")
        plt.close(fig)
        written.append(folder / "canary_exposure.png")
    if "user_inference" in report and (folder / "user_inference.npz").is_file():
        with np.load(folder / "user_inference.npz") as arrays:
            fig, ax = plt.subplots(figsize=(4.5, 4.2))
            _plot_roc(ax, arrays, report["user_inference"])
        fig.savefig(folder / "user_inference_roc.png", dpi=120, bbox_inches="tight")
        plt.close(fig)
        written.append(folder / "user_inference_roc.png")
    return written


def _eps(value: Any) -> str:
    return value if isinstance(value, str) else f"{float(value):.3g}"


def format_text_audit(report: dict[str, Any]) -> str:
    """The audit's numbers as lines of text, next to the ledger's ε and its relation."""
    lines = [
        f"ledger ε = {format_epsilon(report['ledger_epsilon'], 3, 'g')} at δ = {format_delta(report['delta'])} "
        f"({report.get('neighboring_relation')}; {report['mechanism']} noise, {report['scheme']} sampling, "
        f"{report['population']} users, {report['rounds']} rounds)"
    ]
    if "canary" in report:
        c = report["canary"]
        init = {_cell(lv): lv["mean_exposure"] for lv in c.get("initial_model", [])}
        sized = len({_cell(lv)[1] for lv in c["by_level"]}) > 1
        for lv in c["by_level"]:
            ext = lv.get("mean_extrapolated_exposure")
            lines.append(
                f"canaries {_cell_label(lv, sized)}: exposure {lv['mean_exposure']:.2f} bits "
                f"(initial model {init.get(_cell(lv), float('nan')):.2f}; "
                f"extrapolated {'–' if ext is None else f'{ext:.2f}'}; {lv['canaries']} canaries)"
            )
    if "user_inference" in report:
        u = report["user_inference"]
        lb = u["epsilon_lower_bound"]
        lines.append(
            f"user inference: AUC {u['auc']['estimate']:.3f} [{u['auc']['low']:.3f}, {u['auc']['high']:.3f}], "
            f"TPR@1%FPR {u['tpr_at_1pct_fpr']['estimate']:.3f}, TPR@0.1%FPR {u['tpr_at_0.1pct_fpr']['estimate']:.3f} "
            f"({u['held_in']} held-in vs {u['held_out']} held-out users)"
        )
        lines.append(
            f"ε lower bound {_eps(lb['epsilon_lb'])} ({100 * lb['confidence']:.0f}% confidence, {lb['method']}) "
            f"vs ledger ε {format_epsilon(report['ledger_epsilon'], 3, 'g')}"
        )
    return "\n".join(lines)
