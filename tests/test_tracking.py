"""Experiment tracking (fedsim.reporting.tracking): rows written through each tracker and read back with the
real libraries — TensorBoard's event reader, MLflow's search and metric history — including a
resumed run continuing the same TensorBoard log and the same MLflow run. The TensorBoard and
MLflow tests are skipped when the ``tracking`` extra is not installed."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fedsim.errors import FedsimError
from fedsim.reporting.tracking import (
    STATE_FILE,
    MLflowTracker,
    TensorBoardTracker,
    TrackerGroup,
    local_store_uri,
    make_trackers,
    numeric_items,
)

CONFIG: dict[str, Any] = {
    "name": "trk_test",
    "seed": 0,
    "rounds": 4,
    "data": {"name": "shakespeare", "max_users": 40, "root": None},
    "client": {"lr": 2.0, "clip_norm": 1.0},
    "privacy": {"mechanism": "blt", "target_epsilon": 8.0, "publish_side_statistics": True},
    "sim": {"engine": "inprocess", "num_workers": 1},
}
DROPS = {"client_error": 0, "missing": 0, "stale": 0}


def row(r: int, shift: float = 0.0) -> dict[str, Any]:
    """A metrics row shaped like fedsim's (nested drop counters, None values, a string)."""
    return {
        "round": r,
        "epsilon": 2.0 * r + shift,
        "train_loss": None if r == 2 else 4.0 - 0.25 * r + shift,
        "cohort_size": r + 1,
        "drop_reasons": {**DROPS, "stale": r},
        "clipped_fraction": 0.5,
        "clip_norm": 1.0,
        "example_epsilon_max": None,
        "eval_accuracy": 0.01 * r,
        "note": "not a number",
        "seconds": 0.1 * r,
    }


def expected(rows: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """tag -> {step: value} for what the trackers must log."""
    out: dict[str, dict[int, float]] = {}
    for rw in rows:
        for k, v in numeric_items(rw, skip=("round",)).items():
            out.setdefault(k, {})[rw["round"]] = v
    return out


def write_metrics(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    (d / "config.toml").write_text('name = "trk_test"\n', encoding="utf-8")
    return d


# ------------------------------------------------------------------------------------------
# without the extra


def test_numeric_items_flattens_and_skips_what_is_not_a_number() -> None:
    items = numeric_items({**row(2), "flag": True, "eps": "inf", "lst": [1, 2]}, skip=("round",))
    assert items["drop_reasons/stale"] == 2.0 and items["flag"] == 1.0 and math.isinf(items["eps"])
    assert not {"round", "train_loss", "example_epsilon_max", "note", "lst", "drop_reasons"} & set(items)


@pytest.mark.parametrize(
    "uri", ["http://127.0.0.1:5000", "databricks", "sqlite:///mlflow.db", "file://otherhost/mlruns", "./mlruns"]
)
def test_a_store_that_is_not_a_local_file_uri_is_refused(uri: str) -> None:
    with pytest.raises(FedsimError, match="local 'file:' store"):
        make_trackers(mlflow_uri=uri)


def test_file_uris_are_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert local_store_uri("file:./mlruns") == (tmp_path / "mlruns").resolve().as_uri()
    assert local_store_uri(f"file://{tmp_path}/a%20b") == (tmp_path / "a b").as_uri()


def test_a_missing_package_says_to_install_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n in ("mlflow", "tensorboard") else real(n))
    with pytest.raises(FedsimError, match=r"--tensorboard needs the 'tensorboard' package.*fedsim\[tracking\]"):
        make_trackers(tensorboard=True)
    with pytest.raises(FedsimError, match=r"--mlflow needs the 'mlflow' package.*fedsim\[tracking\]"):
        make_trackers(mlflow_uri="file:./mlruns")
    assert make_trackers() == []


def test_the_module_imports_neither_flower_ray_nor_the_extras() -> None:
    code = (
        "import sys, fedsim.reporting.tracking; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'flwr', 'ray', 'mlflow', 'tensorboard', 'torch'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


class _Fake:
    def __init__(self, name: str, fail: bool = False) -> None:
        self.name, self.fail, self.rows, self.finished = name, fail, [], []

    def start(self, run_dir: Any, config: Any, params: Any = None) -> None:
        pass

    def log_row(self, row: Any) -> None:
        if self.fail:
            raise OSError("disk full")
        self.rows.append(row["round"])

    def finish(self, summary: Any = None, status: Any = None) -> None:
        self.finished.append(status)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Any) -> None:
        pass


def test_a_tracker_failing_mid_run_is_reported_once_and_dropped(run_dir: Path) -> None:
    warnings: list[str] = []
    good, bad = _Fake("good"), _Fake("bad", fail=True)
    group = TrackerGroup([bad, good], warn=warnings.append)
    group.start(run_dir, CONFIG)
    for r in (1, 2, 3):
        group.log_row(row(r))
    group.finish({"epsilon": 1.0})
    group.finish({"epsilon": 1.0})
    assert good.rows == [1, 2, 3] and good.finished == [None]
    assert bad.finished == ["FAILED"]
    assert len(warnings) == 1 and "bad tracking failed" in warnings[0] and "disk full" in warnings[0]


# ------------------------------------------------------------------------------------------
# TensorBoard


def tb_scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = ea_mod.EventAccumulator(str(log_dir), size_guidance={ea_mod.SCALARS: 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def assert_same(got: dict[str, dict[int, float]], want: dict[str, dict[int, float]]) -> None:
    assert set(got) == set(want)
    for tag, points in want.items():
        assert sorted(got[tag]) == sorted(points), tag
        for step, v in points.items():
            assert got[tag][step] == pytest.approx(v, rel=1e-6), (tag, step)


def test_tensorboard_holds_every_numeric_value_at_its_round(run_dir: Path) -> None:
    pytest.importorskip("tensorboard")
    rows = [row(r) for r in (1, 2, 3)]
    tracker = make_trackers(tensorboard=True)[0]
    assert isinstance(tracker, TensorBoardTracker)
    tracker.start(run_dir, CONFIG)
    for rw in rows:
        tracker.log_row(rw)
    tracker.finish({"epsilon": 6.0, "final_eval_accuracy": 0.03, "examples_per_user": {"mean": 7}, "name": "x"})
    tracker.finish({"epsilon": 6.0})  # idempotent
    got = tb_scalars(run_dir / "tensorboard")
    summary = {k: got.pop(k) for k in list(got) if k.startswith("summary/")}
    assert_same(got, expected(rows))
    assert 2 not in got["train_loss"] and "drop_reasons/stale" in got
    assert summary == {
        "summary/epsilon": {3: 6.0},
        "summary/final_eval_accuracy": {3: pytest.approx(0.03)},
        "summary/examples_per_user/mean": {3: 7.0},
    }
    assert json.loads((run_dir / STATE_FILE).read_text())["tensorboard"] == {"last_round": 3, "status": "FINISHED"}


def test_a_resumed_tensorboard_log_replaces_the_recomputed_rounds(run_dir: Path) -> None:
    pytest.importorskip("tensorboard")
    first = TensorBoardTracker()
    first.start(run_dir, CONFIG)
    for r in (1, 2, 3):
        first.log_row(row(r))
    first._writer.close()  # the process dies: no finish()
    write_metrics(run_dir, [row(1), row(2)])  # the checkpoint was after round 2
    second = TensorBoardTracker()
    second.start(run_dir, CONFIG)
    for rw in (row(3, shift=0.5), row(4, shift=0.5)):
        second.log_row(rw)
    second.finish(None)
    assert_same(tb_scalars(run_dir / "tensorboard"), expected([row(1), row(2), row(3, 0.5), row(4, 0.5)]))
    assert len(list((run_dir / "tensorboard").iterdir())) == 2  # one event file per process
    assert json.loads((run_dir / STATE_FILE).read_text())["tensorboard"]["status"] == "KILLED"


def test_tensorboard_enabled_on_resume_logs_the_earlier_rows(run_dir: Path) -> None:
    pytest.importorskip("tensorboard")
    write_metrics(run_dir, [row(1), row(2)])
    tracker = TensorBoardTracker()
    tracker.start(run_dir, CONFIG)
    tracker.log_row(row(3))
    tracker.finish(None)
    assert_same(tb_scalars(run_dir / "tensorboard"), expected([row(1), row(2), row(3)]))


def test_unpublished_side_statistics_are_not_tracked(run_dir: Path) -> None:
    pytest.importorskip("tensorboard")
    config = {**CONFIG, "privacy": {**CONFIG["privacy"], "publish_side_statistics": False}}
    tracker = TensorBoardTracker()
    tracker.start(run_dir, config)
    tracker.log_row(row(1))
    tracker.finish(None)
    tags = set(tb_scalars(run_dir / "tensorboard"))
    assert {"epsilon", "clip_norm", "seconds"} <= tags
    assert not {"train_loss", "cohort_size", "clipped_fraction", "eval_accuracy", "drop_reasons/stale"} & tags


# ------------------------------------------------------------------------------------------
# MLflow


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A local store; the reading side (mlflow.search_runs, MlflowClient()) finds it through the
    environment, as a user's shell would."""
    pytest.importorskip("mlflow")
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    return uri


def history(run_id: str, key: str) -> dict[int, float]:
    from mlflow.tracking import MlflowClient

    points = MlflowClient().get_metric_history(run_id, key)
    assert len({m.step for m in points}) == len(points), f"{key}: a step logged twice"
    return {m.step: m.value for m in points}


def artifacts(run_id: str) -> set[str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    top = {a.path for a in client.list_artifacts(run_id)}
    return top | {a.path for a in client.list_artifacts(run_id, "plots")}


def finished_folder(run_dir: Path, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    """What the runner leaves in a completed run folder, checkpoint included."""
    write_metrics(run_dir, rows)
    (run_dir / "ledger.json").write_text("{}", encoding="utf-8")
    (run_dir / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    (run_dir / "checkpoint").mkdir()
    (run_dir / "checkpoint" / "checkpoint.pt").write_bytes(b"secret seeds")
    (run_dir / "plots").mkdir()
    (run_dir / "plots" / "epsilon.png").write_bytes(b"png")


def test_mlflow_holds_the_params_metrics_and_artifacts(run_dir: Path, store: str) -> None:
    import mlflow

    rows = [row(r) for r in (1, 2, 3)]
    summary = {"epsilon": 6.0, "final_eval_accuracy": 0.03, "notes": []}
    tracker = make_trackers(mlflow_uri=store)[0]
    assert isinstance(tracker, MLflowTracker)
    tracker.start(run_dir, CONFIG, {"noise_multiplier": 0.39})
    for rw in rows:
        tracker.log_row(rw)
    finished_folder(run_dir, rows, summary)
    tracker.finish(summary)
    tracker.finish(summary)

    runs = mlflow.search_runs(experiment_names=["trk_test"], output_format="list")
    assert [r.info.run_id for r in runs] == [tracker.run_id]
    run = runs[0]
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    params = run.data.params
    assert params["privacy.target_epsilon"] == "8.0" and params["data.name"] == "shakespeare"
    assert params["data.root"] == "null" and params["noise_multiplier"] == "0.39" and params["rounds"] == "4"
    for key, points in expected(rows).items():
        assert history(tracker.run_id, key) == pytest.approx(points), key
    assert history(tracker.run_id, "summary/epsilon") == {3: 6.0}
    assert artifacts(tracker.run_id) == {
        "config.toml",
        "metrics.jsonl",
        "ledger.json",
        "summary.json",
        "plots",
        "plots/epsilon.png",
    }
    state = json.loads((run_dir / STATE_FILE).read_text())["mlflow"]
    assert state["run_id"] == tracker.run_id and state["tracking_uri"] == store


def test_a_resumed_run_continues_the_same_mlflow_run(run_dir: Path, store: str) -> None:
    import mlflow

    first = MLflowTracker(store)
    first.start(run_dir, CONFIG)
    for r in (1, 2, 3):
        first.log_row(row(r))
    write_metrics(run_dir, [row(1), row(2)])  # Ctrl-C: checkpoint after round 2 ...
    first.finish(None)  # ... and the interrupted run's finish
    assert mlflow.get_run(first.run_id).info.status == "KILLED"

    resumed = MLflowTracker(store)  # a new process on the same folder
    resumed.start(run_dir, {**CONFIG, "sim": {**CONFIG["sim"], "num_workers": 2}})
    assert resumed.run_id == first.run_id
    assert mlflow.get_run(first.run_id).info.status == "RUNNING"
    for r in (3, 4):
        resumed.log_row(row(r))
    resumed.finish({"epsilon": 8.0})

    runs = mlflow.search_runs(experiment_names=["trk_test"], output_format="list")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert history(first.run_id, "epsilon") == {1: 2.0, 2: 4.0, 3: 6.0, 4: 8.0}
    assert runs[0].data.params["sim.num_workers"] == "1"
    assert runs[0].data.tags["fedsim.changed_on_resume.sim.num_workers"] == "2"
    assert runs[0].data.tags["fedsim.resumes"] == "1"


def test_mlflow_enabled_on_resume_logs_the_earlier_rows(run_dir: Path, store: str) -> None:
    write_metrics(run_dir, [{**row(1), "epsilon": "inf"}, row(2)])  # metrics.jsonl writes ∞ as "inf"
    tracker = MLflowTracker(store)
    tracker.start(run_dir, CONFIG)
    tracker.log_row(row(3))
    tracker.finish(None, status="FAILED")
    assert history(tracker.run_id, "epsilon") == {1: math.inf, 2: 4.0, 3: 6.0}
    assert history(tracker.run_id, "drop_reasons/stale") == {1: 1.0, 2: 2.0, 3: 3.0}


def test_a_run_deleted_from_the_store_is_started_afresh(run_dir: Path, store: str) -> None:
    from mlflow.tracking import MlflowClient

    first = MLflowTracker(store)
    first.start(run_dir, CONFIG)
    first.log_row(row(1))
    write_metrics(run_dir, [row(1)])
    first.finish(None)
    MlflowClient().delete_run(first.run_id)
    second = MLflowTracker(store)
    second.start(run_dir, CONFIG)
    assert second.run_id != first.run_id
    assert history(second.run_id, "epsilon") == {1: 2.0}  # the folder's rows, logged again
    second.finish(None)
