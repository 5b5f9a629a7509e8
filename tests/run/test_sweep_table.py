"""``fedsim sweep``'s bookkeeping without Ray: which finished trials an arm's row aggregates (only
those that ran under the arm's planned accounting spec), the table's ε / δ / relation cells, trial
names that never collide, trials that failed, and the report's text and plots."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest
from helpers import experiment_script

import fedsim.runner.sweep as sweep
from fedsim.errors import FedsimError
from fedsim.runner.build import resolve_privacy
from fedsim.runner.sweep import arm_table, load_spec, markdown_table, read_base, run_sweep, trial_config, trials

ROOT = Path(__file__).resolve().parents[2]

BASE = [
    "data.name='synthetic'",
    "data.num_clients=40",
    "model.name='logreg'",
    "rounds=3",
    "sampling.cohort_size=10",
    "eval.every=0",
    "eval.max_users=8",
    "privacy.mechanism='gaussian'",
    "privacy.noise_multiplier=1.0",
]

POISSON = [*BASE, "sampling.scheme='poisson'"]


def _toml(name: str, base: list[str], arms: dict[str, list[str]], axes: str = "") -> str:
    """A grid sweep spec: ``base`` overrides, seeds 0 and 1, the ``arms`` (name → overrides), ``axes``."""
    text = f'[sweep]\nname = "{name}"\nset = {json.dumps(base)}\nseeds = [0, 1]\n'
    for arm, sets in arms.items():
        text += f'\n[[sweep.arms]]\nname = "{arm}"\nset = {json.dumps(sets)}\n'
    return text + (f"\n[sweep.axes]\n{axes}\n" if axes else "")


MIXED = _toml(
    "mixed",
    BASE,
    {
        "fixed": ["sampling.scheme='fixed'"],
        "poisson": ["sampling.scheme='poisson'"],
        "poisson_d1e-4": ["sampling.scheme='poisson'", "privacy.delta=1e-4"],
    },
)


def _spec(tmp_path: Path, text: str = MIXED) -> Path:
    p = tmp_path / "spec.toml"
    p.write_text(text, encoding="utf-8")
    return p


def _row(trial: str, arm: str, acc: float | None, eps: float, delta: float = 1e-5, rel: str = "add_or_remove_one"):
    return {
        "trial": trial,
        "arm": arm,
        "seed": int(trial.rsplit("=", 1)[1]),
        "final_eval_accuracy": acc,
        "epsilon": eps,
        "delta": delta,
        "neighboring_relation": rel,
        "wall_seconds": 1.25,
    }


def _finish(out: Path, trial: dict[str, Any], raw: dict[str, Any], acc: float, spec: Any = None) -> Any:
    """A finished trial folder as a run writes it: ``ledger.json`` with the accounting spec the
    trial's config gives (or ``spec``), ``summary.json`` with its ε, δ and relation."""
    cfg = trial_config(raw, trial["sets"])
    ran = spec if spec is not None else resolve_privacy(cfg, 40)
    folder = out / "trials" / trial["name"]
    folder.mkdir(parents=True)
    (folder / "ledger.json").write_text(json.dumps({"spec": ran.to_dict()}), encoding="utf-8")
    (folder / "metrics.jsonl").write_text(json.dumps({"round": 3, "eval_accuracy": acc}) + "\n", encoding="utf-8")
    summary = {
        "final_eval_accuracy": acc,
        "epsilon": 2.0 if ran.scheme == "fixed" else (1.0 if ran.delta > 1e-4 else 3.0),
        "delta": ran.delta,
        "neighboring_relation": ran.neighboring_relation,
        "noise_multiplier": ran.noise_multiplier,
        "wall_seconds": 1.0,
        "model_sha256": "x",
    }
    (folder / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return ran


def _no_ray(monkeypatch, outcomes: list[tuple[dict[str, Any], bool]] | None = None) -> None:
    """``run_sweep`` without Ray: the trials' folders are already there; Tune reports ``outcomes``."""
    monkeypatch.setattr(sweep, "_fit", lambda *args, **kwargs: list(outcomes or []))


def test_a_trial_not_as_planned_is_left_out_and_named(tmp_path, monkeypatch):
    """Attack (review: mixed/resume_stray.sh): a finished fixed-cohort trial (ε for replacing one
    user) copied into a Poisson arm's folder before ``--resume`` was averaged into the Poisson
    arm's ε and printed as add/remove. Every sweep now checks each finished trial's ledger against
    its arm's planned accounting spec: the stray is left out of the row and named."""
    spec, base = load_spec(_spec(tmp_path))
    raw = read_base(base)
    out = tmp_path / "out"
    items = {t["name"]: t for t in trials(spec)}
    for name in ["fixed,seed=0", "fixed,seed=1", "poisson,seed=0", "poisson_d1e-4,seed=0", "poisson_d1e-4,seed=1"]:
        _finish(out, items[name], raw, 0.5)
    fixed = resolve_privacy(trial_config(raw, items["fixed,seed=1"]["sets"]), 40)
    _finish(out, items["poisson,seed=1"], raw, 0.9, spec=fixed)  # the copied-in folder
    _no_ray(monkeypatch)
    result = run_sweep(_spec(tmp_path), out, resume=True)
    assert result["not_as_planned"] == ["poisson,seed=1"] == result["selection"]["not_as_planned"]
    assert "poisson,seed=1" not in {t["trial"] for t in result["trials"]}
    assert "not as planned" in result["selection"]["note"] and "poisson,seed=1" in result["selection"]["note"]
    arms = {a["arm"]: a for a in result["arms"]}
    assert arms["poisson"]["seeds"] == 1 and arms["poisson"]["planned"] == 2 and arms["poisson"]["not_as_planned"] == 1
    assert arms["poisson"]["epsilon"] == 1.0 and arms["poisson"]["neighboring_relation"] == "add_or_remove_one"
    assert arms["poisson"]["final_eval_accuracy"] == 0.5  # not (0.5 + 0.9) / 2
    assert arms["fixed"]["neighboring_relation"] == "replace_one" and arms["fixed"]["seeds"] == 2
    md = (out / "table.md").read_text()
    assert "| poisson | 1/2 (+1 not as planned, left out) |" in md
    # δ is a column of every output: the two Poisson arms differ only in δ
    assert arms["poisson_d1e-4"]["delta"] == 1e-4 and arms["poisson"]["delta"] == pytest.approx(40**-1.1)
    saved = json.loads((out / "sweep.json").read_text())
    assert saved["not_as_planned"] == ["poisson,seed=1"] and saved["arms"][2]["delta"] == 1e-4
    with (out / "table.csv").open(newline="") as fh:
        csv_rows = {r["arm"]: r for r in csv.DictReader(fh)}
    assert float(csv_rows["poisson_d1e-4"]["delta"]) == 1e-4
    assert "| poisson_d1e-4 | 2/2 | 50.00 ± 0.00 | 3.000 | 0.0001 | add_or_remove_one |" in md


def test_a_cell_never_mixes_relations_delta_or_drops_an_infinite_epsilon():
    """Attack (review t1_table_units.py): an arm whose trials' ε hold for different relations or δ
    got one ε cell (labelled with the first trial's relation), and an ∞ beside a finite ε was
    dropped from the arm's ε."""
    rows = [_row("a,seed=0", "a", 0.5, 2.0), _row("a,seed=1", "a", 0.6, math.inf)]
    assert arm_table(rows, "final_eval_accuracy")[0]["epsilon"] == math.inf
    mixed = [_row("b,seed=0", "b", 0.5, 2.0), _row("b,seed=1", "b", 0.6, 4.0, 1e-3, "replace_one")]
    (row,) = arm_table(mixed, "final_eval_accuracy")
    assert row["epsilon"] is None and row["delta"] is None and row["neighboring_relation"] == "mixed"
    md = markdown_table([row], "final_eval_accuracy")
    assert "add_or_remove_one" not in md and "replace_one" not in md and "| mixed |" in md
    # the arm's ε is never below any of its trials' (the largest, rounded up when printed)
    (same,) = arm_table([_row("c,seed=0", "c", 0.5, 8.8431), _row("c,seed=1", "c", 0.6, 8.8434)], "final_eval_accuracy")
    assert same["epsilon"] == 8.8434 and "| 8.844 |" in markdown_table([same], "final_eval_accuracy")


def test_one_seed_shows_no_std_and_wall_time_has_a_decimal():
    """Review: one seed printed "± 0.00", which reads as a measured spread; wall time had no decimals."""
    (row,) = arm_table([_row("a,seed=0", "a", 0.5, 2.0)], "final_eval_accuracy", planned={"a": 3})
    md = markdown_table([row], "final_eval_accuracy")
    assert "± 0.00" not in md and "50.00 (1 seed)" in md and "| 1/3 |" in md and "1.2 (1 seed)" in md
    assert row["final_eval_accuracy_std"] is None


def test_a_pipe_or_newline_never_shifts_the_markdown_columns():
    """Review t3_markdown_pipe.py: an axis value with ``|`` moved the ε column under the accuracy."""
    spec = sweep.SweepSpec.model_validate({"axes": {"data.cache_dir": ["cache|v2", "a\nb", "x"]}})
    items = trials(spec)
    assert all("|" not in t["name"] and "\n" not in t["name"] for t in items)
    rows = [_row(t["name"], t["arm"], 0.7, 1.1) for t in items]
    rows.append(_row("odd|arm\nx,seed=0", "odd|arm\nx", 0.7, 1.1))  # an arm name from elsewhere
    md = markdown_table(arm_table(rows, "final_eval_accuracy"), "final_eval_accuracy")
    lines = md.splitlines()
    assert len(lines) == 2 + 4
    assert {line.replace("\\|", "").count("|") for line in lines} == {8}


def test_csv_cells_are_not_formulas(tmp_path):
    spec = sweep.SweepSpec.model_validate({"arms": [{"name": "=1+2"}]})
    rows = [_row("=1+2,seed=0", "=1+2", 0.5, 1.0)]
    sweep._write_outputs(tmp_path, spec, rows, {"note": ""}, arm_table(rows, "final_eval_accuracy"))
    with (tmp_path / "table.csv").open(newline="") as fh:
        assert next(csv.DictReader(fh))["arm"] == "'=1+2"


@pytest.mark.parametrize(
    ("toml", "match"),
    [
        ("seeds = [0, 1, 1]", "sweep.seeds repeats 1"),
        ('[sweep.axes]\n"client.lr" = [0.5, 0.50]', r'sweep.axes."client.lr" repeats 0.5'),
        ('[sweep.axes]\n"data.cache_dir" = ["1", 1]', "same trial name"),
    ],
)
def test_a_trial_named_twice_is_refused(tmp_path, toml, match):
    """Attack (review dupseed/run.sh, t2_label_collision.py): ``seeds = [0, 1, 1]`` ran seed 1 once
    and counted it twice; repeated axis values, or values with the same text, shared a folder."""
    with pytest.raises(FedsimError, match=match):
        load_spec(_spec(tmp_path, f"[sweep]\n{toml}\n"))


def test_separators_in_values_are_escaped_and_plain_names_stay():
    """Review t2: ``,`` and ``=`` in string values made 8 grid points 3 trial names. Values
    without the escaped characters keep the names they had (a resumed sweep finds its folders)."""
    spec = sweep.SweepSpec.model_validate(
        {
            "axes": {
                "data.cache_dir": ["r,privacy.delta_reason=x", "r"],
                "privacy.delta_reason": ["y", "x,privacy.delta_reason=y"],
                "client.lr": [0.5],
            }
        }
    )
    names = [t["name"] for t in trials(spec)]
    assert len(set(names)) == len(names) == 4
    assert "base,data.cache_dir=r%2Cprivacy.delta_reason%3Dx,privacy.delta_reason=y,client.lr=0.5,seed=0" in names
    assert sweep._label("data.root", "a/b%c\\d") == "data.root=a%2Fb%25c%5Cd"  # as before
    assert (
        sweep._label("client.lr", 0.1) == "client.lr=0.1" and sweep._label("x", "plain-text_1.0") == "x=plain-text_1.0"
    )


def test_only_matches_whole_parts_of_a_trial_name(tmp_path):
    """Review: ``--only seed=1`` also ran ``seed=10`` (a substring match)."""
    text = f"[sweep]\nset = {json.dumps(POISSON)}\nseeds = [1, 10]\n"
    spec, base = load_spec(_spec(tmp_path, text))
    names = [t["name"] for t in sweep._planned_trials(spec, read_base(base), "seed=1")]
    assert names == ["base,seed=1"]
    assert [t["name"] for t in sweep._planned_trials(spec, read_base(base), "base,seed=10")] == ["base,seed=10"]
    with pytest.raises(FedsimError, match="matches no trial"):
        sweep._planned_trials(spec, read_base(base), "seed=")


SEARCH = f"""
[sweep]
name = "search"
set = {json.dumps(POISSON)}
seeds = [0]

[sweep.search]
num_samples = 4
space = SPACE
"""


@pytest.mark.parametrize(
    ("space", "match"),
    [
        ('{"privacy.noise_multiplier" = {choice = [1.0, -1.0]}}', "noise_multiplier=-1.0.*invalid config"),
        ('{"client.lr" = {loguniform = [0.0, 1.0]}}', "need 0 < low <= high"),
        ('{"client.lr" = {uniform = [2.0, 1.0]}}', "need low <= high"),
        ('{"client.lr" = {choice = []}}', "choice is empty"),
    ],
)
def test_a_search_space_is_checked_before_anything_runs(tmp_path, space, match):
    """Review search2/run.sh: a choice of -1.0 for the noise multiplier failed 3 of 4 trials at run
    time and the sweep exited 0; every choice and range end is now checked up front."""
    with pytest.raises(FedsimError, match=match):
        run_sweep(_spec(tmp_path, SEARCH.replace("SPACE", space)), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_failed_search_and_asha_trials_are_missing(tmp_path, monkeypatch):
    """Review search/run.sh: ``missing`` was always [] for a search and under ASHA, so failed trials
    disappeared. Tune's errored trials are now missing (and ``failed``); a trial ASHA stopped on
    purpose is not."""
    spec_path = _spec(tmp_path, SEARCH.replace("SPACE", '{"client.lr" = {choice = [0.5, 1.0]}}'))
    spec, base = load_spec(spec_path)
    raw = read_base(base)
    good = sweep._searched_trial({"params": {"client.lr": 0.5}, "seed": 0, "set": spec.set})
    bad = sweep._searched_trial({"params": {"client.lr": 1.0}, "seed": 0, "set": spec.set})
    out = tmp_path / "out"
    _finish(out, good, raw, 0.6)
    _no_ray(monkeypatch, [(good, False), (bad, True), (good, False)])  # a point drawn twice is one trial
    result = run_sweep(spec_path, out, resume=True)
    assert result["missing"] == result["failed"] == [bad["name"]]
    assert [t["trial"] for t in result["trials"]] == [good["name"]]
    assert {a["arm"]: (a["seeds"], a["planned"]) for a in result["arms"]} == {
        "client.lr=0.5": (1, 1),
        "client.lr=1.0": (0, 1),
    }
    from fedsim.reporting.sweep_report import selection_line

    assert f"1 trial(s) did not finish ({bad['name']})" in selection_line(out)

    asha = f"[sweep]\nset = {json.dumps(POISSON)}\nseeds = [0, 1, 2]\nscheduler = 'asha'\n"
    spec_path = _spec(tmp_path, asha)
    spec, _ = load_spec(spec_path)
    t0, t1, t2 = trials(spec)
    _finish(tmp_path / "asha", t0, raw, 0.6)
    _no_ray(monkeypatch, [(t0, False), (t1, False), (t2, True)])  # t1 stopped by ASHA, t2 failed
    result = run_sweep(spec_path, tmp_path / "asha", resume=True)
    assert result["missing"] == [t2["name"]]


class _Result:
    def __init__(self, config: dict[str, Any], error: Exception | None) -> None:
        self.config, self.error = config, error


def test_outcomes_read_tunes_result_grid():
    trial = {"name": "a,seed=0", "arm": "a", "seed": 0, "sets": []}
    grid = [
        _Result({"trial": trial, "out": "x"}, None),
        _Result({"params": {"client.lr": 0.5}, "seed": 3, "set": []}, RuntimeError("boom")),
    ]
    assert sweep._outcomes(grid) == [(trial, False), (sweep._searched_trial(grid[1].config), True)]


def test_report_plots_label_the_relation_and_delta(tmp_path, monkeypatch):
    """Review: the accuracy-vs-ε x-axis was labelled with the first arm's relation, whatever the
    others'. It names relation and δ only when every arm shares them."""
    import matplotlib.axes

    from fedsim.reporting.sweep_report import plot_accuracy_vs_epsilon, plot_arms

    labels: list[str] = []
    monkeypatch.setattr(matplotlib.axes.Axes, "set_xlabel", lambda self, text, *a, **k: labels.append(text))
    base_arm = {"final_eval_accuracy": 0.5, "final_eval_accuracy_std": None, "seeds": 1, "planned": 1}
    arms = [
        {**base_arm, "arm": "fixed", "epsilon": 8.0, "delta": 1e-5, "neighboring_relation": "replace_one"},
        {**base_arm, "arm": "poisson", "epsilon": 1.0, "delta": 1e-5, "neighboring_relation": "add_or_remove_one"},
    ]
    result = {"metric": "final_eval_accuracy", "arms": arms, "trials": []}
    plot_accuracy_vs_epsilon(tmp_path, result)
    assert "replace one" not in labels[-1] and "differ" in labels[-1]
    plot_accuracy_vs_epsilon(tmp_path, {**result, "arms": arms[1:]})
    assert labels[-1] == "ε (add/remove one user, δ = 1e-05)"
    plot_arms(tmp_path, result)
    assert (tmp_path / "arms.png").stat().st_size > 0


def _experiment(name: str) -> Any:
    return experiment_script(name)


@pytest.mark.parametrize("name", ["mechanism_grid", "filter_ablation"])
def test_experiment_wrappers_resume_a_sweep_that_stopped_before_ray(tmp_path, name):
    """Review: the wrappers resumed only if ``tune/`` existed, but ``run_sweep`` writes ``plan.json``
    before Ray starts, so a sweep killed in between was refused on the next run ("already holds a
    sweep") for good."""
    mod = _experiment(name)
    assert mod.is_started(tmp_path) is False
    (tmp_path / "plan.json").write_text("{}")
    assert mod.is_started(tmp_path) is True


#: the arms of the experiment-wrapper tests (names shaped like the wrappers' ``mechanism+filter``).
WRAPPER_ARMS = {"gaussian+none": ["sampling.scheme='poisson'"], "fixed+none": ["sampling.scheme='fixed'"]}


def _wrapped_sweep(
    tmp_path: Path, axis: str, base: list[str] = BASE
) -> tuple[Path, dict[str, dict[str, Any]], dict[str, Any]]:
    """A sweep folder as ``run_sweep`` leaves it before any trial finished (``plan.json``), for a
    small grid shaped like an experiment wrapper's: ``(folder, trials by name, base table)``."""
    spec_path = _spec(tmp_path, _toml("wrapped", base, WRAPPER_ARMS, axis))
    spec, base = load_spec(spec_path)
    raw = read_base(base)
    out = tmp_path / "out"
    out.mkdir()
    (out / sweep.PLAN_FILE).write_text(json.dumps(sweep.sweep_plan(spec, base, raw, None)), encoding="utf-8")
    return out, {t["name"]: t for t in trials(spec)}, raw


def test_filter_ablation_says_its_lr_choice_is_not_accounted(tmp_path, monkeypatch, capsys):
    """Review: the wrapper picks each arm's server lr on seed 0 and reports a mean that includes
    seed 0, with no word that the choice is outside ε. And its table reads only trials that ran
    as planned: a fixed-cohort trial copied into the Poisson arm's folder (the attack of
    ``test_a_trial_not_as_planned_is_left_out_and_named``), or a folder that is no trial of the
    sweep, is left out and named, never averaged in."""
    mod = _experiment("filter_ablation")
    out, items, raw = _wrapped_sweep(tmp_path, '"server.lr" = [1.0, 2.5]')
    for lr, seed, acc in [(1.0, 0, 0.24), (2.5, 0, 0.03), (1.0, 1, 0.18)]:
        _finish(out, items[f"gaussian+none,server.lr={lr},seed={seed}"], raw, acc)
    fixed = resolve_privacy(trial_config(raw, items["fixed+none,server.lr=2.5,seed=1"]["sets"]), 40)
    _finish(out, items["gaussian+none,server.lr=2.5,seed=1"], raw, 0.99, spec=fixed)  # copied in
    stranger = dict(items["gaussian+none,server.lr=1.0,seed=0"], name="gaussian+none,server.lr=9.0,seed=0")
    _finish(out, stranger, raw, 0.99)  # a folder of another sweep
    monkeypatch.setattr("sys.argv", ["filter_ablation.py", "--out", str(out), "--table"])
    mod.main()
    printed = capsys.readouterr().out
    assert "lr 1 " in printed and "24.00 / 18.00" in printed and "selection not accounted" in printed
    assert "99" not in printed.split("left out")[0]  # neither stray is in any number
    left = "['gaussian+none,server.lr=2.5,seed=1', 'gaussian+none,server.lr=9.0,seed=0']"
    assert f"left out (not as planned: another accounting spec, or not a trial of this sweep): {left}" in printed
    saved = json.loads((out / "ablation.json").read_text())
    assert saved["left_out"] == eval(left) and saved["arms"]["gaussian+none"]["lr"] == 1.0


def test_mechanism_grid_table_reads_only_trials_as_planned(tmp_path):
    """The same check in ``experiments/mechanism_grid.py --table``: a trial whose ledger holds
    another arm's accounting spec (ε for replacing one user, in an add/remove arm) is left out of
    the row and named under the table."""
    mod = _experiment("mechanism_grid")
    calibrated = [o for o in BASE if not o.startswith("privacy.noise_multiplier")]
    out, items, raw = _wrapped_sweep(tmp_path, '"privacy.target_epsilon" = [2.0]', calibrated)
    fixed = resolve_privacy(trial_config(raw, items["fixed+none,privacy.target_epsilon=2.0,seed=0"]["sets"]), 40)
    for name, acc, spec in [
        ("gaussian+none,privacy.target_epsilon=2.0,seed=0", 0.30, None),
        ("gaussian+none,privacy.target_epsilon=2.0,seed=1", 0.90, fixed),  # copied in
        ("fixed+none,privacy.target_epsilon=2.0,seed=0", 0.20, None),
    ]:
        _finish(out, items[name], raw, acc, spec=spec)
        summary = json.loads((out / "trials" / name / "summary.json").read_text())
        (out / "trials" / name / "summary.json").write_text(json.dumps({**summary, "epsilon": 2.0}))
    table = mod.markdown_table(out)
    gaussian = next(line for line in table.splitlines() if "| gaussian+none |" in line)
    assert "30.00 % (1 seed)" in gaussian and "90" not in gaussian
    assert "left out (not as planned" in table and "gaussian+none,privacy.target_epsilon=2.0,seed=1" in table
