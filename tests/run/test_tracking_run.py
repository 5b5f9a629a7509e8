"""``[tracking]`` in a real run: every metrics row reaches TensorBoard and MLflow (read back with their
own readers), a resumed run continues the same MLflow run, and a bad store URI never starts a run."""

from __future__ import annotations

import json

import pytest

from fedsim.config import load_config
from fedsim.errors import FedsimError
from fedsim.runner import run_experiment

pytest.importorskip("tensorboard")
mlflow = pytest.importorskip("mlflow")

BASE = [
    "data.name='synthetic'",
    "data.num_clients=30",
    "model.name='logreg'",
    "rounds=4",
    "sampling.scheme='poisson'",
    "sampling.cohort_size=8",
    "privacy.mechanism='gaussian'",
    "privacy.noise_multiplier=1.0",
    "eval.every=2",
    "eval.max_users=6",
    "sim.num_workers=1",
]


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_run_writes_every_row_to_tensorboard_and_mlflow(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    uri = f"file:{tmp_path / 'mlruns'}"
    cfg = load_config(None, BASE + ["tracking.tensorboard=true", f"tracking.mlflow_uri='{uri}'"])
    out = tmp_path / "run"
    run_experiment(cfg, out, progress=False)
    rows = _rows(out)
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    eps = acc.Scalars("epsilon")
    assert [e.step for e in eps] == [r["round"] for r in rows]
    assert [e.value for e in eps] == pytest.approx([r["epsilon"] for r in rows], rel=1e-6)
    # float32 keeps an upper bound only if rounded up: the logged ε is never below the ledger's
    assert all(e.value >= r["epsilon"] for e, r in zip(eps, rows, strict=True))
    # Read through the environment, as a user's shell would; monkeypatch undoes it, so the
    # store does not leak into later tests (a global ``mlflow.set_tracking_uri`` would).
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    runs = mlflow.search_runs(search_all_experiments=True)
    assert len(runs) == 1 and runs.iloc[0]["params.privacy.noise_multiplier"] == "1.0"
    # what the logged ε holds for, next to it
    assert runs.iloc[0]["params.neighboring_relation"] == "add_or_remove_one"
    assert runs.iloc[0]["params.effective_accountant"] == "pld"
    assert float(runs.iloc[0]["params.delta"]) == json.loads((out / "summary.json").read_text())["delta"]
    hist = mlflow.tracking.MlflowClient().get_metric_history(runs.iloc[0]["run_id"], "epsilon")
    assert [(m.step, pytest.approx(m.value, rel=1e-9)) for m in hist] == [(r["round"], r["epsilon"]) for r in rows]
    artifacts = {a.path for a in mlflow.tracking.MlflowClient().list_artifacts(runs.iloc[0]["run_id"])}
    assert {"metrics.jsonl", "ledger.json", "summary.json", "config.toml"} <= artifacts
    assert not any("checkpoint" in a for a in artifacts)  # the checkpoint holds keys: never uploaded


def test_a_bad_store_uri_is_refused_before_the_run():
    with pytest.raises(FedsimError, match="file:"):
        load_config(None, BASE + ["tracking.mlflow_uri='http://example.com:5000'"])
