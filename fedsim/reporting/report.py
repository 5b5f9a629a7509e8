"""Read finished (or running) run folders back, plot them and compare them.

A run folder holds ``metrics.jsonl`` (one JSON object per round), ``summary.json``
and ``config.toml``. Everything here only reads those files; nothing needs Flower,
Ray or torch. Plots use matplotlib's non-interactive ``Agg`` backend, so they work
on headless machines, and every figure is closed after it is saved.

Conventions: ε is a float, ``math.inf`` when the run had no differential privacy
(the files store that as the string ``"inf"``); accuracies are fractions in
``[0, 1]`` and are shown as percentages only by :func:`format_table`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedsim.errors import FedsimError, writing
from fedsim.privacy.display import format_delta, format_epsilon

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
PLOTS_DIR = "plots"

#: Columns of :func:`comparison_table`, in order, with the header :func:`format_table` prints.
TABLE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run", "run"),
    ("name", "name"),
    ("mechanism", "mechanism"),
    ("noise_multiplier", "noise"),
    ("epsilon", "epsilon"),
    ("delta", "delta"),
    ("neighboring_relation", "relation"),
    ("accountant", "accountant"),
    ("rounds", "rounds"),
    ("population", "population"),
    ("final_eval_accuracy", "final_acc"),
    ("best_eval_accuracy", "best_acc"),
    ("wall_seconds", "wall_s"),
)

_TEXT_COLUMNS = frozenset({"run", "name", "mechanism", "neighboring_relation", "accountant"})


# ----------------------------------------------------------------------------- reading


def _epsilon(value: Any, where: str) -> float | None:
    """Turn a stored ε (number, ``"inf"`` or null) into a float (``math.inf`` for no DP)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise FedsimError(f'{where}: epsilon must be a number or "inf", got {value!r}')
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            parsed = float(value.strip())
        except ValueError:
            parsed = math.nan
        if math.isinf(parsed) and parsed > 0:
            return math.inf
        if math.isfinite(parsed):
            return parsed
    raise FedsimError(f'{where}: epsilon must be a number or "inf", got {value!r}')


def _read_text(path: Path) -> str:
    """Read ``path`` as UTF-8, turning every failure into a :class:`FedsimError`."""
    if not path.is_file():
        raise FedsimError(
            f"{path}: file not found; is {path.parent} a fedsim run folder "
            f"(it should contain {METRICS_FILE} and {SUMMARY_FILE})?"
        )
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise FedsimError(f"{path}: not UTF-8 text ({exc})") from exc
    except OSError as exc:
        raise FedsimError(f"{path}: cannot be read ({exc.strerror or exc})") from exc


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Parse a run's ``metrics.jsonl``, one dict per round, in file order.

    Parameters
    ----------
    run_dir : str or Path
        The run folder that contains ``metrics.jsonl``.

    Returns
    -------
    list of dict
        One dict per non-blank line. ``epsilon`` is a float, ``math.inf`` where the
        file says ``"inf"`` (no differential privacy); other keys are as stored
        (``eval_accuracy`` etc. are ``None`` in rounds that were not evaluated).

    Raises
    ------
    FedsimError
        If the file is missing or unreadable, or a line is not a JSON object with
        a ``round`` key; the message names the file and the line number.
    """
    path = Path(run_dir) / METRICS_FILE
    rows: list[dict[str, Any]] = []
    for lineno, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise FedsimError(
                f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); the file may be truncated or corrupted"
            ) from exc
        if not isinstance(row, dict):
            raise FedsimError(f"{where}: expected a JSON object per line, got {type(row).__name__}")
        if "round" not in row:
            raise FedsimError(f"{where}: the object has no 'round' key")
        if "epsilon" in row:
            row["epsilon"] = _epsilon(row["epsilon"], where)
        rows.append(row)
    return rows


def read_summary(run_dir: str | Path) -> dict[str, Any]:
    """Parse a run's ``summary.json``.

    Parameters
    ----------
    run_dir : str or Path
        The run folder that contains ``summary.json``.

    Returns
    -------
    dict
        The summary, with ``epsilon`` as a float (``math.inf`` for no DP).

    Raises
    ------
    FedsimError
        If the file is missing or unreadable, is not valid JSON, or is not a JSON
        object; the message names the file.
    """
    path = Path(run_dir) / SUMMARY_FILE
    try:
        summary = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise FedsimError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from exc
    if not isinstance(summary, dict):
        raise FedsimError(f"{path}: expected a JSON object, got {type(summary).__name__}")
    if "epsilon" in summary:
        summary["epsilon"] = _epsilon(summary["epsilon"], str(path))
    return summary


def _summary_or_none(run_dir: Path) -> dict[str, Any] | None:
    """The summary, or None while a run is still going and has not written one yet."""
    if not (run_dir / SUMMARY_FILE).exists():
        return None
    return read_summary(run_dir)


def _run_name(run_dir: Path, summary: dict[str, Any] | None) -> str:
    """The run's name from its summary, else the folder name."""
    if summary and summary.get("name"):
        return str(summary["name"])
    return run_dir.name


def _accuracy_curve(metrics: Iterable[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """(rounds, eval accuracies) of the evaluated rounds, sorted by round."""
    points = sorted((int(m["round"]), float(m["eval_accuracy"])) for m in metrics if m.get("eval_accuracy") is not None)
    return [r for r, _ in points], [a for _, a in points]


# ----------------------------------------------------------------------------- plotting


def _pyplot() -> Any:
    """matplotlib.pyplot on the headless ``Agg`` backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _empty_note(ax: Axes, text: str) -> None:
    """Write ``text`` in the middle of an otherwise empty axes."""
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=14, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _round_axis(ax: Axes, rounds: Sequence[int] = ()) -> None:
    """Label the x axis "round" with whole-number ticks only (a one-round plot included: its
    axis spans a round either side, so it has integers to tick)."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("round")
    if not ax.lines and not ax.collections:  # an empty placeholder plot keeps its ticks hidden
        return
    if rounds and max(rounds) - min(rounds) < 2:
        ax.set_xlim(min(rounds) - 1, max(rounds) + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def _series(metrics: Iterable[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(rounds, values) of the rounds where `key` is a finite number, sorted by round."""
    points = sorted(
        (int(m["round"]), float(m[key]))
        for m in metrics
        if isinstance(m.get(key), (int, float)) and not isinstance(m.get(key), bool) and math.isfinite(m[key])
    )
    return [r for r, _ in points], [v for _, v in points]


#: The pictures of a run, in the order they are drawn and shown: (file stem, title, y label).
RUN_PLOTS: tuple[tuple[str, str, str], ...] = (
    ("train_loss", "train loss", "mean train loss of the cohort"),
    ("accuracy", "eval accuracy", "eval accuracy"),
    ("eval_loss", "eval loss", "eval loss"),
    ("epsilon", "privacy budget", "ε"),
)


def run_figures(run_dir: str | Path) -> dict[str, Any]:
    """The figures of one run against the round (matplotlib `Figure` objects, not saved;
    close them with `matplotlib.pyplot.close`): `train_loss`, `accuracy` (evaluated rounds,
    with the majority-class line when the summary has one), `eval_loss` and `epsilon` (a note
    instead of a curve where there is nothing to draw: no evaluated round, no DP, side statistics
    not published).

    Parameters
    ----------
    run_dir : str or Path
        The run folder; `metrics.jsonl` is required, `summary.json` is used for the name, the
        baseline and the ε label when present (a running job has none yet).
    """
    run_path = Path(run_dir)
    metrics = read_metrics(run_path)
    summary = _summary_or_none(run_path)
    name = _run_name(run_path, summary)
    plt = _pyplot()
    figures: dict[str, Any] = {}
    for stem, title, ylabel in RUN_PLOTS:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        figures[stem] = fig
        if stem == "epsilon":
            rounds, values = _series(metrics, "epsilon")
            empty = "no DP (ε = ∞)" if any(m.get("epsilon") == math.inf for m in metrics) else "no ε recorded"
            ylabel = _epsilon_label(summary)
        else:
            rounds, values = _series(metrics, {"accuracy": "eval_accuracy"}.get(stem, stem))
            empty = "no evaluated rounds" if stem != "train_loss" else "no train loss recorded"
        if rounds:
            ax.plot(rounds, values, marker="o", markersize=3, label=title)
        else:
            _empty_note(ax, empty)
        baseline = (summary or {}).get("majority_baseline_accuracy") if stem == "accuracy" else None
        if baseline is not None:
            ax.axhline(float(baseline), linestyle="--", color="grey", label="majority class")
        if rounds and baseline is not None:
            ax.legend(loc="best")
        _round_axis(ax, rounds)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{name}: {title}")
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
    return figures


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Draw one run's pictures and its HTML page.

    Writes `train_loss.png`, `accuracy.png`, `eval_loss.png` and `epsilon.png` against
    the round (`run_figures`; with `filter.trace_coordinates`, `psd.png` too) into the
    plots folder, and `report.html` into the run folder: one self-contained page (the privacy
    header, the final numbers and the plots embedded as PNG; nothing is fetched from the
    network) to open or share.

    Parameters
    ----------
    run_dir : str or Path
        The run folder; `metrics.jsonl` is required, `summary.json` is used when present.
    out_dir : str or Path, optional
        Folder for the PNGs, created if needed. Default `<run_dir>/plots`.

    Returns
    -------
    list of Path
        The written files: the PNGs, then `report.html`.

    Raises
    ------
    FedsimError
        If `metrics.jsonl` is missing or corrupted, `summary.json` exists but is corrupted,
        or a file cannot be written (a full disk: the message names the file).
    """
    run_path = Path(run_dir)
    target = Path(out_dir) if out_dir is not None else run_path / PLOTS_DIR
    redo = f", then draw the pictures again with: fedsim report {run_path} (the run's own files are complete)"
    with writing(target, redo):
        target.mkdir(parents=True, exist_ok=True)
    plt = _pyplot()
    figures = run_figures(run_path)
    written: list[Path] = []
    pngs: dict[str, bytes] = {}
    try:
        for stem, fig in figures.items():
            pngs[stem] = _figure_png(fig)
            written.append(_write_bytes(target / f"{stem}.png", pngs[stem], redo))
    finally:
        for fig in figures.values():
            plt.close(fig)
    trace = run_path / "filter_trace.npz"
    if trace.exists():
        with writing(target / "psd.png", redo):
            written.append(plot_psd(trace, target / "psd.png", title=_run_name(run_path, _summary_or_none(run_path))))
    page = run_html(run_path, pngs)
    written.append(_write_bytes(run_path / REPORT_PAGE, page.encode("utf-8"), redo))
    return written


def _figure_png(fig: Any) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _write_bytes(path: Path, data: bytes, advice: str = "") -> Path:
    """Write `data` to `path` atomically (a full disk leaves the old file, or none, and is a
    one-line error naming `path`)."""
    import os

    tmp = path.with_name(f".{path.name}.tmp")
    with writing(path, advice):
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return path


#: The run's self-contained HTML page, in the run folder.
REPORT_PAGE = "report.html"


def run_html(run_dir: str | Path, pngs: dict[str, bytes]) -> str:
    """The run's HTML page: its privacy header (ε, δ, the relation ε is stated for, the
    mechanism, noise, accountant, population and rounds, and the notes), its final numbers and
    the plots `pngs` (stem → PNG bytes) embedded as base64 `data:` images. No script, style
    sheet or image is fetched from anywhere: the file alone is the page."""
    import base64
    import html

    from fedsim.privacy.accounting import RELATION_LABELS

    run_path = Path(run_dir)
    summary = _summary_or_none(run_path) or {}
    name = _run_name(run_path, summary)
    esc = html.escape
    eps = summary.get("epsilon")
    relation = summary.get("neighboring_relation")
    guarantee = (
        f"ε = {format_epsilon(eps)} at δ = {format_delta(summary['delta'])}"
        f"{f', {RELATION_LABELS.get(relation, relation)}' if relation else ''}"
        if eps is not None and summary.get("delta") is not None
        else "not finished: no summary.json yet"
    )
    header = [
        ("guarantee", guarantee),
        ("what it covers", summary.get("guarantee")),
        ("mechanism", summary.get("mechanism")),
        ("noise multiplier z", _cell("noise_multiplier", summary.get("noise_multiplier"))),
        ("sampling", summary.get("scheme")),
        ("expected cohort K̄", summary.get("cohort_size")),
        ("population N", summary.get("population")),
        ("accountant", summary.get("accountant")),
        ("rounds", summary.get("rounds_completed")),
        ("final eval accuracy", _cell("final_eval_accuracy", summary.get("final_eval_accuracy"))),
        ("majority class", _cell("final_eval_accuracy", summary.get("majority_baseline_accuracy"))),
        ("model parameters", summary.get("num_parameters")),
    ]
    rows = "\n".join(f"<tr><th>{esc(k)}</th><td>{esc(str(v))}</td></tr>" for k, v in header if v is not None)
    notes = "".join(f"<li>{esc(str(n))}</li>" for n in summary.get("notes") or [])
    side = (summary.get("side_statistics") or {}).get("note")
    images = "\n".join(
        f'<figure><img alt="{esc(title)}" src="data:image/png;base64,{base64.b64encode(pngs[stem]).decode()}">'
        f"<figcaption>{esc(title)} against the round</figcaption></figure>"
        for stem, title, _ in RUN_PLOTS
        if stem in pngs
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(name)}: fedsim run</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}}
th{{text-align:left;padding-right:1.5em;font-weight:normal;color:#555}}
figure{{display:inline-block;margin:.5em}}img{{max-width:100%;width:28em}}</style></head>
<body><h1>{esc(name)}</h1>
<p>Run folder: <code>{esc(str(run_path.resolve()))}</code></p>
<h2>Privacy</h2><table>{rows}</table>
{f"<h3>Notes</h3><ul>{notes}</ul>" if notes else ""}
{f"<p><small>{esc(str(side))}</small></p>" if side else ""}
<h2>Against the round</h2>
{images}
</body></html>
"""


def _save(fig: Any, out_path: str | Path) -> Path:
    """Lay out ``fig`` and write it to ``out_path`` (parents created)."""
    fig.tight_layout()
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with writing(out):
        fig.savefig(out, dpi=100, bbox_inches="tight")  # nothing (legend, long labels) is cut off
    return out


def power_spectra(before: np.ndarray, after: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Welch power spectral density over rounds, averaged over the logged coordinates.

    Parameters
    ----------
    before, after : rounds × k arrays of the noisy aggregate's coordinates before and after the
        filter (``filter_trace.npz``).

    Returns ``(frequency in cycles per round, PSD before, PSD after)``.
    """
    from scipy.signal import welch

    n = before.shape[0]
    seg = int(min(64, n))
    f, p_b = welch(before, nperseg=seg, axis=0, detrend=False)  # keep the low frequencies
    _, p_a = welch(after, nperseg=seg, axis=0, detrend=False)
    return f, p_b.mean(axis=1), p_a.mean(axis=1)


def plot_psd(trace_path: str | Path, out_path: str | Path, title: str = "") -> Path:
    """Draw the PSD of the noisy aggregate before and after the server filter (the DOPPLER
    paper's Fig. 2) from a run's ``filter_trace.npz``."""
    data = np.load(trace_path)
    before, after = data["before"], data["after"]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        if before.shape[0] < 4:
            _empty_note(ax, "fewer than 4 rounds logged")
        else:
            f, pb, pa = power_spectra(before, after)
            ax.semilogy(f, pb, label="noisy aggregate ĝ_t (before the filter)")
            ax.semilogy(f, pa, label="after the filter")
            ax.legend(loc="best")
        ax.set_xlabel("frequency (cycles per round)")
        ax.set_ylabel("power spectral density")
        ax.set_title(f"{title}: PSD of {before.shape[1]} logged coordinates")
        ax.grid(True, alpha=0.3)
        return _save(fig, out_path)
    finally:
        plt.close(fig)


def _arm_of(run_dir: Path) -> tuple[str, dict[str, Any]]:
    """The arm of a run: its config without ``seed`` and ``name`` (flattened)."""
    import tomllib

    cfg = tomllib.loads((run_dir / "config.toml").read_text(encoding="utf-8"))

    def flat(d: dict, prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    f = {k: v for k, v in flat(cfg).items() if k not in ("seed", "name")}
    return json.dumps(f, sort_keys=True), f


def ablation_arms(run_dirs: Sequence[str | Path]) -> list[dict[str, Any]]:
    """Group run folders into arms (same config except ``seed``/``name``); each arm has a label
    made of the keys that differ between arms, its runs, and the final accuracies' mean and std."""
    groups: dict[str, dict[str, Any]] = {}
    for d in map(Path, run_dirs):
        key, flat = _arm_of(d)
        groups.setdefault(key, {"config": flat, "runs": []})["runs"].append(d)
    configs = [g["config"] for g in groups.values()]
    varying = sorted({k for c in configs for k in c if any(c.get(k) != o.get(k) for o in configs)})
    arms = []
    for g in groups.values():
        finals = []
        for d in g["runs"]:
            s = _summary_or_none(d) or {}
            if s.get("final_eval_accuracy") is not None:
                finals.append(float(s["final_eval_accuracy"]))
        # A sweep that names its runs "<arm>-s<seed>" is labelled by the arm's name; otherwise by
        # the config keys that differ between arms.
        stems = {re.sub(r"[-_]s(?:eed)?\d+$", "", d.name) for d in g["runs"]}
        label = (
            stems.pop()
            if len(stems) == 1 and not any(d.name in stems for d in g["runs"])
            else ", ".join(f"{k.split('.')[-1]}={g['config'].get(k)}" for k in varying) or "all runs"
        )
        arms.append(
            {
                "label": label,
                "runs": g["runs"],
                "finals": finals,
                "mean": float(np.mean(finals)) if finals else None,
                "std": float(np.std(finals, ddof=1)) if len(finals) > 1 else 0.0,
            }
        )
    return sorted(arms, key=lambda a: a["label"])


def plot_ablation(run_dirs: Sequence[str | Path], out_path: str | Path) -> Path:
    """Ablation figure: eval accuracy against the round per arm (mean over seeds) and the final
    accuracy per arm with ±1 std error bars over seeds. `out_path`'s folder must exist."""
    _in_existing_folder(out_path)
    arms = ablation_arms(run_dirs)
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    try:
        for arm in arms:
            curves = [dict(zip(*_accuracy_curve(read_metrics(d)))) for d in arm["runs"]]
            rounds = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
            if rounds:
                ax1.plot(
                    rounds,
                    [np.mean([c[r] for c in curves]) for r in rounds],
                    marker="o",
                    markersize=3,
                    label=arm["label"],
                )
        _round_axis(ax1)
        ax1.set_ylabel("eval accuracy (mean over seeds)")
        ax1.grid(True, alpha=0.3)
        if any(a["finals"] for a in arms):
            ax1.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize=7)
        ys = np.arange(len(arms))
        ax2.barh(ys, [a["mean"] or 0.0 for a in arms], xerr=[a["std"] for a in arms], capsize=3)
        ax2.set_yticks(ys, [f"{a['label']} (n={len(a['finals'])})" for a in arms], fontsize=7)
        ax2.set_xlabel("final eval accuracy (mean ± std over seeds)")
        ax2.grid(True, axis="x", alpha=0.3)
        return _save(fig, out_path)
    finally:
        plt.close(fig)


def plot_comparison(run_dirs: Sequence[str | Path], out_path: str | Path) -> Path:
    """Overlay the eval-accuracy curves of several runs in one figure.

    Parameters
    ----------
    run_dirs : sequence of str or Path
        The run folders to compare, at least one; each needs ``metrics.jsonl``.
        The legend shows each run's name from ``summary.json`` (the folder name
        when there is no summary, with the folder appended when names repeat).
    out_path : str or Path
        The PNG file to write, in an existing folder.

    Returns
    -------
    Path
        ``out_path``.

    Raises
    ------
    FedsimError
        If ``run_dirs`` is empty or a run's files are missing or corrupted.
    """
    paths = [Path(d) for d in run_dirs]
    if not paths:
        raise FedsimError("plot_comparison: give at least one run folder")
    curves = []
    for run_path in paths:
        name = _run_name(run_path, _summary_or_none(run_path))
        curves.append((name, run_path, _accuracy_curve(read_metrics(run_path))))
    names = [c[0] for c in curves]

    out = _in_existing_folder(out_path)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    try:
        for name, run_path, (rounds, accs) in curves:
            label = name if names.count(name) == 1 else f"{name} ({run_path.name})"
            ax.plot(rounds, accs, marker="o", markersize=3, label=label)
        _round_axis(ax)
        ax.set_ylabel("eval accuracy")
        ax.set_title("eval accuracy: " + ", ".join(dict.fromkeys(names)))
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best")
        fig.tight_layout()
        _write_bytes(out, _figure_png(fig))
    finally:
        plt.close(fig)
    return out


def _in_existing_folder(out_path: str | Path) -> Path:
    """`out_path` as a Path, refused when its folder does not exist (a typo in a path the user
    gave must not create folders)."""
    out = Path(out_path)
    if not out.parent.is_dir():
        raise FedsimError(
            f"{out}: the folder {out.parent} does not exist; create it first, or give a file in an existing folder"
        )
    return out


# ----------------------------------------------------------------------------- tables


def comparison_table(run_dirs: Iterable[str | Path]) -> list[dict[str, Any]]:
    """One row of headline numbers per run, for :func:`format_table`.

    Parameters
    ----------
    run_dirs : iterable of str or Path
        The run folders; each needs ``summary.json`` and ``metrics.jsonl``.

    Returns
    -------
    list of dict
        One dict per run, in the given order, with keys ``run`` (folder name),
        ``name``, ``mechanism``, ``noise_multiplier``, ``epsilon`` (float,
        ``math.inf`` for no DP), ``delta``, ``neighboring_relation`` (whom ε protects:
        ``add_or_remove_one``, ``replace_one`` or ``zero_out``), ``accountant`` (the one that
        computed ε), ``rounds`` (rounds completed),
        ``population``, ``final_eval_accuracy``, ``best_eval_accuracy`` (the
        maximum over all evaluated rounds, None if none was) and ``wall_seconds``.
        Keys missing from a summary are None.

    Raises
    ------
    FedsimError
        If a run's files are missing or corrupted.
    """
    rows: list[dict[str, Any]] = []
    for run_dir in run_dirs:
        run_path = Path(run_dir)
        summary = read_summary(run_path)
        _, accs = _accuracy_curve(read_metrics(run_path))
        finite = [a for a in accs if not math.isnan(a)]
        rows.append(
            {
                "run": run_path.name,
                "name": summary.get("name"),
                "mechanism": summary.get("mechanism"),
                "noise_multiplier": summary.get("noise_multiplier"),
                "epsilon": summary.get("epsilon"),
                "delta": summary.get("delta"),
                "neighboring_relation": summary.get("neighboring_relation"),
                "accountant": summary.get("accountant"),
                "rounds": summary.get("rounds_completed"),
                "population": summary.get("population"),
                "final_eval_accuracy": summary.get("final_eval_accuracy"),
                "best_eval_accuracy": max(finite) if finite else None,
                "wall_seconds": summary.get("wall_seconds"),
            }
        )
    return rows


def _epsilon_label(summary: dict[str, Any] | None) -> str:
    """The ε axis's label: with δ (rounded up) and the neighbouring relation where the summary
    gives them (an ε is a guarantee only with both)."""
    from fedsim.privacy.accounting import RELATION_LABELS

    summary = summary or {}
    delta, relation = summary.get("delta"), summary.get("neighboring_relation")
    if delta is None or relation is None:
        return "ε (spent so far)"
    return f"ε spent so far (δ = {format_delta(delta)}, {RELATION_LABELS.get(relation, relation)})"


def _cell(key: str, value: Any) -> str:
    """Format one table cell; None is shown as ``-``."""
    if value is None:
        return "-"
    if isinstance(value, bool) or isinstance(value, str):
        return str(value)
    if not isinstance(value, (int, float)):
        return str(value)
    number = float(value)
    if math.isnan(number):
        return "nan"
    if key == "epsilon":  # rounded up: a printed ε never claims more privacy than was accounted
        return format_epsilon(number, 3, "g")
    if math.isinf(number):
        return "inf" if number > 0 else "-inf"
    if key.endswith("accuracy"):
        return f"{100.0 * number:.2f}%"
    if key == "delta":  # rounded up, as ε
        return format_delta(number, 1, "e")
    if key == "noise_multiplier":
        return f"{number:.3g}"
    if key == "wall_seconds":
        return f"{number:.1f}"
    if isinstance(value, int):
        return str(value)
    return f"{number:.4g}"


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Render :func:`comparison_table` rows as a fixed-width plain-text table.

    Parameters
    ----------
    rows : sequence of dict
        Rows as returned by :func:`comparison_table`; missing keys print as ``-``.

    Returns
    -------
    str
        A header line, a dashed rule and one line per row, without a trailing
        newline. Text columns are left-aligned and numbers right-aligned;
        accuracies are percentages with 2 decimals, ε has 3 significant digits
        (or ``inf``), δ is in ``%.1e`` form, both rounded up.
    """
    headers = [label for _, label in TABLE_COLUMNS]
    body = [[_cell(key, row.get(key)) for key, _ in TABLE_COLUMNS] for row in rows]
    widths = [max([len(h)] + [len(line[i]) for line in body]) for i, h in enumerate(headers)]

    def render(cells: Sequence[str]) -> str:
        parts = []
        for (key, _), cell, width in zip(TABLE_COLUMNS, cells, widths, strict=True):
            parts.append(cell.ljust(width) if key in _TEXT_COLUMNS else cell.rjust(width))
        return "  ".join(parts).rstrip()

    lines = [render(headers), "  ".join("-" * w for w in widths)]
    lines.extend(render(line) for line in body)
    return "\n".join(lines)


__all__ = [
    "comparison_table",
    "format_table",
    "plot_comparison",
    "plot_run",
    "read_metrics",
    "read_summary",
]
