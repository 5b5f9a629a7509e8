"""Tests of fedsim.reporting.report on hand-written run folders (no training involved)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fedsim.errors import FedsimError
from fedsim.reporting.report import (
    comparison_table,
    format_table,
    plot_comparison,
    plot_run,
    read_metrics,
    read_summary,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# eval every 2 rounds: rounds 2 and 4 are evaluated, the others are null
DP_ACCURACIES = {2: 0.21, 4: 0.35}
NODP_ACCURACIES = {2: 0.30, 4: 0.42}


def make_run(
    root: Path,
    folder: str,
    *,
    name: str,
    accuracies: dict[int, float],
    final_accuracy: float,
    dp: bool,
    rounds: int = 5,
    baseline: float | None = 0.17,
) -> Path:
    """Write a fake run folder with ``rounds`` rounds of metrics, a summary and a config."""
    run = root / folder
    run.mkdir(parents=True)
    lines = []
    for t in range(1, rounds + 1):
        acc = accuracies.get(t)
        lines.append(
            json.dumps(
                {
                    "round": t,
                    "epsilon": 0.5 * t if dp else "inf",
                    "train_loss": 3.0 - 0.1 * t,
                    "eval_accuracy": acc,
                    "eval_loss": None if acc is None else 2.5 - acc,
                    "dropped_updates": 0,
                    "cohort_size": 10,
                    "seconds": 0.25,
                }
            )
        )
    # a trailing blank line must be skipped
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    summary = {
        "name": name,
        "final_eval_accuracy": final_accuracy,
        "epsilon": 0.5 * rounds if dp else "inf",
        "delta": 1e-5,
        "noise_multiplier": 1.1 if dp else 0.0,
        "mechanism": "gaussian" if dp else "none",
        "rounds_completed": rounds,
        "population": 715,
        "model_sha256": "0" * 64,
        "wall_seconds": 12.345,
    }
    if baseline is not None:
        summary["majority_baseline_accuracy"] = baseline
    (run / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    (run / "config.toml").write_text(f'name = "{name}"\n', encoding="utf-8")
    return run


@pytest.fixture
def dp_run(tmp_path: Path) -> Path:
    return make_run(tmp_path, "run_dp", name="dp-sigma1.1", accuracies=DP_ACCURACIES, final_accuracy=0.33, dp=True)


@pytest.fixture
def nodp_run(tmp_path: Path) -> Path:
    return make_run(
        tmp_path,
        "run_nodp",
        name="no-dp",
        accuracies=NODP_ACCURACIES,
        final_accuracy=0.40,
        dp=False,
        baseline=None,
    )


def assert_png(path: Path) -> None:
    assert path.is_file(), path
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert len(data) > 2000, f"{path} is suspiciously small ({len(data)} bytes)"


# ----------------------------------------------------------------------------- reading


def test_read_metrics_skips_blank_lines_and_converts_inf(dp_run: Path, nodp_run: Path) -> None:
    metrics = read_metrics(dp_run)
    assert [m["round"] for m in metrics] == [1, 2, 3, 4, 5]
    assert metrics[2]["epsilon"] == pytest.approx(1.5)
    assert [m["eval_accuracy"] for m in metrics] == [None, 0.21, None, 0.35, None]
    nodp = read_metrics(str(nodp_run))  # str paths work too
    assert all(m["epsilon"] == math.inf for m in nodp)


def test_read_summary_converts_inf(nodp_run: Path) -> None:
    summary = read_summary(nodp_run)
    assert summary["name"] == "no-dp"
    assert summary["epsilon"] == math.inf


def test_missing_metrics_names_the_file(tmp_path: Path) -> None:
    run = tmp_path / "empty_run"
    run.mkdir()
    with pytest.raises(FedsimError, match="metrics.jsonl") as info:
        read_metrics(run)
    assert str(run) in str(info.value)
    with pytest.raises(FedsimError, match="metrics.jsonl"):
        plot_run(run)


def test_corrupted_metrics_line_names_file_and_line(dp_run: Path) -> None:
    path = dp_run / "metrics.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[2] = lines[2][: len(lines[2]) // 2]  # a truncated write on line 3
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(FedsimError, match=r"metrics\.jsonl, line 3") as info:
        read_metrics(dp_run)
    assert "JSON" in str(info.value)
    with pytest.raises(FedsimError, match="metrics.jsonl"):
        comparison_table([dp_run])


def test_non_object_metrics_line_is_an_error(dp_run: Path) -> None:
    with (dp_run / "metrics.jsonl").open("a", encoding="utf-8") as fh:
        fh.write("[1, 2, 3]\n")
    with pytest.raises(FedsimError, match=r"metrics\.jsonl, line \d+: expected a JSON object"):
        read_metrics(dp_run)


def test_missing_and_corrupted_summary_name_the_file(dp_run: Path) -> None:
    (dp_run / "summary.json").write_text('{"name": "x", ', encoding="utf-8")
    with pytest.raises(FedsimError, match="summary.json"):
        read_summary(dp_run)
    (dp_run / "summary.json").unlink()
    with pytest.raises(FedsimError, match="summary.json"):
        read_summary(dp_run)


# ----------------------------------------------------------------------------- plots


RUN_PNGS = ["train_loss.png", "accuracy.png", "eval_loss.png", "epsilon.png"]


def test_plot_run_writes_four_pngs_and_a_page(dp_run: Path) -> None:
    paths = plot_run(dp_run)
    assert [p.name for p in paths] == [*RUN_PNGS, "report.html"]
    assert all(p.parent == dp_run / "plots" for p in paths[:-1]) and paths[-1] == dp_run / "report.html"
    for p in paths[:-1]:
        assert_png(p)


def test_plot_run_no_dp_and_custom_out_dir(nodp_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "elsewhere" / "figs"
    paths = plot_run(nodp_run, out_dir=out)
    assert [p.name for p in paths[:-1]] == RUN_PNGS
    for p in paths[:-1]:
        assert p.parent == out
        assert_png(p)


def _drawn(ax) -> list[tuple[list[float], list[float]]]:
    """The data series of an axes (its lines, the majority-class line included)."""
    return [(list(map(float, ln.get_xdata())), list(map(float, ln.get_ydata()))) for ln in ax.lines]


def test_run_figures_draw_each_series_against_whole_rounds(dp_run: Path) -> None:
    """Axes labels, the series from metrics.jsonl, and integer round ticks only."""
    import matplotlib.pyplot as plt

    from fedsim.reporting.report import run_figures

    figures = run_figures(dp_run)
    try:
        assert list(figures) == ["train_loss", "accuracy", "eval_loss", "epsilon"]
        axes = {k: f.axes[0] for k, f in figures.items()}
        for k, ax in axes.items():
            assert ax.get_xlabel() == "round", k
            f = figures[k]
            f.canvas.draw()
            assert all(float(t).is_integer() for t in ax.get_xticks()), (k, ax.get_xticks())
        assert _drawn(axes["train_loss"]) == [([1, 2, 3, 4, 5], pytest.approx([2.9, 2.8, 2.7, 2.6, 2.5]))]
        assert axes["train_loss"].get_ylabel() == "mean train loss of the cohort"
        acc, baseline = _drawn(axes["accuracy"])
        assert acc == ([2, 4], [0.21, 0.35]) and baseline[1] == [0.17, 0.17]  # majority class line
        assert axes["accuracy"].get_ylabel() == "eval accuracy"
        assert _drawn(axes["eval_loss"]) == [([2, 4], pytest.approx([2.29, 2.15]))]
        assert _drawn(axes["epsilon"]) == [([1, 2, 3, 4, 5], [0.5, 1.0, 1.5, 2.0, 2.5])]
        assert axes["epsilon"].get_ylabel().startswith("ε")
    finally:
        for f in figures.values():
            plt.close(f)


@pytest.mark.parametrize("rounds", [1, 2])
def test_a_one_or_two_round_plot_has_no_fractional_round_ticks(tmp_path: Path, rounds: int) -> None:
    import matplotlib.pyplot as plt

    from fedsim.reporting.report import run_figures

    run = make_run(tmp_path, "short", name="s", accuracies={rounds: 0.3}, final_accuracy=0.3, dp=True, rounds=rounds)
    figures = run_figures(run)
    try:
        for k, f in figures.items():
            f.canvas.draw()
            ticks = f.axes[0].get_xticks()
            assert len(ticks) >= 1 and all(float(t).is_integer() for t in ticks), (k, ticks)
    finally:
        for f in figures.values():
            plt.close(f)


def test_a_run_without_dp_or_evaluation_gets_notes_not_empty_axes(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    from fedsim.reporting.report import run_figures

    run = make_run(tmp_path, "r", name="n", accuracies={}, final_accuracy=0.1, dp=False, baseline=None)
    figures = run_figures(run)
    try:
        texts = {k: [t.get_text() for t in f.axes[0].texts] for k, f in figures.items()}
        assert texts["accuracy"] == ["no evaluated rounds"] and texts["eval_loss"] == ["no evaluated rounds"]
        assert texts["epsilon"] == ["no DP (ε = ∞)"] and texts["train_loss"] == []
    finally:
        for f in figures.values():
            plt.close(f)


def test_the_run_page_is_self_contained_with_the_privacy_header(dp_run: Path) -> None:
    import base64
    import re

    plot_run(dp_run)
    page = (dp_run / "report.html").read_text(encoding="utf-8")
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 4 and all(base64.b64decode(i)[:8] == PNG_SIGNATURE for i in images)
    assert not re.search(r"(src|href)=\"(?!data:)", page) and "<script" not in page and "http" not in page
    assert "<th>guarantee</th><td>ε = 2.500 at δ = 1e-05" in page  # the summary's ε, rounded up as the CLI prints it
    assert "<th>noise multiplier z</th><td>1.1</td>" in page and "<th>population N</th><td>715</td>" in page


def test_plot_run_figures_are_closed(dp_run: Path) -> None:
    import matplotlib.pyplot as plt

    before = len(plt.get_fignums())
    plot_run(dp_run)
    assert len(plt.get_fignums()) == before


def test_plot_comparison(dp_run: Path, nodp_run: Path, tmp_path: Path) -> None:
    out = plot_comparison([dp_run, nodp_run], tmp_path / "accuracy.png")
    assert out == tmp_path / "accuracy.png"
    assert_png(out)
    with pytest.raises(FedsimError):
        plot_comparison([], tmp_path / "none.png")


def test_a_plot_path_in_a_missing_folder_is_refused_not_created(dp_run: Path, tmp_path: Path, capsys) -> None:
    from helpers import run_cli

    missing = tmp_path / "nonexistent" / "dir"
    for option in ("--plot", "--ablation"):
        code, _, err = run_cli(capsys, "report", str(dp_run), option, str(missing / "x.png"))
        assert code == 2 and f"the folder {missing} does not exist" in err, err
        assert not missing.parent.exists()


def test_report_says_where_each_picture_is(dp_run: Path, nodp_run: Path, tmp_path: Path, capsys) -> None:
    from helpers import run_cli

    code, out, err = run_cli(capsys, "report", str(dp_run), str(nodp_run), "--plot", str(tmp_path / "cmp.png"))
    assert code == 0, err
    for run in (dp_run, nodp_run):
        line = next(ln for ln in out.splitlines() if ln.startswith(f"{run}: "))
        named = [Path(p) for p in line.split(": ", 1)[1].split(", ")]
        assert [p.name for p in named] == [*RUN_PNGS, "report.html"] and all(p.is_file() for p in named)
    assert f"--plot: {tmp_path / 'cmp.png'}" in out
    code, out, err = run_cli(capsys, "report", str(dp_run), "--json")
    assert code == 0 and json.loads(out)[0]["run"] == "run_dp" and f"{dp_run}: " in err  # stdout stays JSON


# ----------------------------------------------------------------------------- tables


def test_comparison_table(dp_run: Path, nodp_run: Path) -> None:
    rows = comparison_table([dp_run, nodp_run])
    assert [r["run"] for r in rows] == ["run_dp", "run_nodp"]
    dp, nodp = rows
    assert dp["name"] == "dp-sigma1.1"
    assert dp["mechanism"] == "gaussian"
    assert dp["best_eval_accuracy"] == pytest.approx(0.35)
    assert dp["final_eval_accuracy"] == pytest.approx(0.33)
    assert dp["epsilon"] == pytest.approx(2.5)
    assert dp["rounds"] == 5
    assert dp["population"] == 715
    assert nodp["best_eval_accuracy"] == pytest.approx(0.42)
    assert nodp["final_eval_accuracy"] == pytest.approx(0.40)
    assert nodp["epsilon"] == math.inf
    assert set(dp) == {
        "run", "name", "mechanism", "noise_multiplier", "epsilon", "delta", "neighboring_relation",
        "accountant", "rounds", "population", "final_eval_accuracy", "best_eval_accuracy", "wall_seconds",
    }  # fmt: skip


def test_best_accuracy_is_none_without_eval(tmp_path: Path) -> None:
    run = make_run(tmp_path, "r", name="noeval", accuracies={}, final_accuracy=0.1, dp=True)
    (row,) = comparison_table([run])
    assert row["best_eval_accuracy"] is None
    assert "noeval" in format_table([row])


def test_format_table(dp_run: Path, nodp_run: Path) -> None:
    text = format_table(comparison_table([dp_run, nodp_run]))
    lines = text.splitlines()
    assert len(lines) == 4  # header, rule, two rows
    header = lines[0].split()
    for column in ("run", "name", "mechanism", "epsilon", "delta", "final_acc", "best_acc"):
        assert column in header
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert "dp-sigma1.1" in text and "no-dp" in text
    assert "run_dp" in text and "run_nodp" in text
    dp_line = next(line for line in lines if "dp-sigma1.1" in line)
    nodp_line = next(line for line in lines if "no-dp" in line)
    assert "35.00%" in dp_line and "33.00%" in dp_line
    assert "2.5" in dp_line.split() and "1.0e-05" in dp_line.split()
    assert "inf" in nodp_line.split() and "42.00%" in nodp_line
    # fixed-width columns: every column starts at the same offset on every line
    start = lines[0].index("epsilon")
    end = start + len("epsilon")
    assert dp_line[start:end].strip() == "2.5"
    assert nodp_line[start:end].strip() == "inf"


def test_format_table_empty_and_sparse_rows() -> None:
    empty = format_table([])
    assert empty.splitlines()[0].split()[0] == "run"
    sparse = format_table([{"run": "x", "epsilon": 0.123456, "delta": None}])
    row = sparse.splitlines()[2]
    # ε and δ are rounded up: 0.123456 shows as 0.124 (0.123 would claim more privacy)
    assert row.startswith("x") and "0.124" in row.split() and "-" in row.split()
    header = format_table([{"run": "x", "epsilon": 1.0, "delta": 0.017263}]).splitlines()
    assert "1.8e-02" in header[2].split() and "relation" in header[0].split()


# ----------------------------------------------------------------------------- ablation and PSD


def test_ablation_groups_runs_by_config_without_seed(tmp_path: Path) -> None:
    from fedsim.reporting.report import ablation_arms, plot_ablation

    runs = []
    for arm, finals in (("ema", (0.30, 0.32, 0.34)), ("none", (0.20, 0.26))):
        for seed, fin in enumerate(finals):
            r = make_run(
                tmp_path,
                f"{arm}-s{seed}",
                name=f"{arm}-s{seed}",
                accuracies={2: fin - 0.1, 4: fin},
                final_accuracy=fin,
                dp=True,
            )
            (r / "config.toml").write_text(
                f'name = "{arm}-s{seed}"\nseed = {seed}\n[filter]\nname = "{arm}"\n', encoding="utf-8"
            )
            runs.append(r)
    arms = ablation_arms(runs)
    assert [a["label"] for a in arms] == ["ema", "none"]  # the run names without "-s<seed>"
    assert arms[0]["mean"] == pytest.approx(0.32) and arms[0]["std"] == pytest.approx(0.02)
    assert arms[1]["mean"] == pytest.approx(0.23) and len(arms[1]["finals"]) == 2
    assert_png(plot_ablation(runs, tmp_path / "ablation.png"))


def test_ablation_label_falls_back_to_the_differing_keys(tmp_path: Path) -> None:
    from fedsim.reporting.report import ablation_arms

    runs = []
    for i, (arm, seed) in enumerate((("ema", 0), ("ema", 1), ("none", 0))):
        r = make_run(tmp_path, f"run{i}", name=f"run{i}", accuracies={2: 0.2}, final_accuracy=0.2, dp=True)
        (r / "config.toml").write_text(f'name = "run{i}"\nseed = {seed}\n[filter]\nname = "{arm}"\n', encoding="utf-8")
        runs.append(r)
    assert [a["label"] for a in ablation_arms(runs)] == ["name=ema", "name=none"]


def test_psd_of_filtered_white_noise_has_the_filter_gain(tmp_path: Path) -> None:
    """White noise through DOPPLER first_order_v1: the PSD after / before integrates to the
    white-noise variance gain Σκ² = 0.0909 (docs/algorithms.md §9); the low frequencies pass."""
    import numpy as np
    import torch

    from fedsim.reporting.report import plot_psd, power_spectra
    from fedsim.server.filters import make_filter

    rng = np.random.default_rng(0)
    before = rng.normal(size=(2048, 32)).astype(np.float32)
    f = make_filter("doppler", preset="first_order_v1")
    after = np.stack([f.step(torch.from_numpy(row)).numpy() for row in before])
    freq, pb, pa = power_spectra(before, after)
    assert np.mean(pa) / np.mean(pb) == pytest.approx(1 / 11, rel=0.1)
    assert pa[0] / pb[0] > 0.5 and pa[-1] / pb[-1] < 0.01  # low-pass
    np.savez(tmp_path / "filter_trace.npz", index=np.arange(32), before=before, after=after)
    assert_png(plot_psd(tmp_path / "filter_trace.npz", tmp_path / "psd.png", title="t"))


def test_server_traces_coordinates_before_and_after_the_filter() -> None:
    import numpy as np
    import torch

    from fedsim.privacy.accounting import AccountingSpec
    from fedsim.privacy.ledger import Ledger
    from fedsim.privacy.noise import gaussian_noise
    from fedsim.server.filters import make_filter
    from fedsim.server.optim import make_optimizer
    from fedsim.server.step import DPServer

    spec = AccountingSpec("gaussian", "poisson", 100, 10, 1.0, 1e-3)
    srv = DPServer(
        torch.zeros(50),
        gaussian_noise(50, 1),
        make_optimizer("sgd", 1.0),
        Ledger(spec, 6),
        1.0,
        1.0,
        10,
        filter=make_filter("ema", kappa=0.5),
    )
    srv.enable_trace(8, seed=3)
    for _ in range(6):
        srv.step(torch.zeros(50), 10)
    b, a = torch.stack(srv.trace["before"]).numpy(), torch.stack(srv.trace["after"]).numpy()
    assert b.shape == a.shape == (6, 8)
    ref = make_filter("ema", kappa=0.5)
    want = np.stack([ref.step(torch.from_numpy(r)).numpy() for r in b])
    np.testing.assert_allclose(a, want, rtol=1e-6)
    state = srv.state_dict()
    assert len(state["trace"]["before"]) == 6
