"""The public Python API (``fedsim.__all__``), used as a researcher would: a config from a dict,
a run, its result read back and checked against the ledger, a model defined outside the package
registered and trained, and the refusals that keep a registration honest."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import fedsim
from fedsim.privacy.ledger import recompute_epsilon

ROOT = Path(__file__).resolve().parents[1]
SMALL = {
    "rounds": 2,
    "data": {"name": "synthetic", "num_clients": 12},
    "model": {"name": "logreg"},
    "sampling": {"scheme": "poisson", "cohort_size": 4},
    "privacy": {"mechanism": "gaussian", "noise_multiplier": 1.0},
    "eval": {"every": 0},
    "sim": {"engine": "inprocess", "num_workers": 1},
}


def test_import_fedsim_is_light_and_lists_its_api():
    code = "import fedsim, sys; print(sorted(m for m in ('torch', 'flwr', 'ray') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == "[]"
    for name in fedsim.__all__:
        assert getattr(fedsim, name) is not None
    with pytest.raises(AttributeError):
        fedsim.no_such_thing  # noqa: B018


def test_run_from_a_dict_returns_the_result_and_the_ledger_agrees(tmp_path):
    result = fedsim.run(SMALL, tmp_path / "run", overrides=["rounds=3"])
    assert [r["round"] for r in result.metrics] == [1, 2, 3]
    ledger = json.loads((result.run_folder / "ledger.json").read_text())
    assert result.epsilon == pytest.approx(recompute_epsilon(ledger), rel=1e-12)
    assert result.neighboring_relation == "add_or_remove_one" and 0 < result.delta < 1 / 12
    assert result.final_parameters.numel() == result.summary["num_parameters"]
    model = result.final_model()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert torch.equal(flat, result.final_parameters)
    report = fedsim.privacy_report(SMALL, overrides=["rounds=3"])
    assert report["epsilon"] == pytest.approx(result.epsilon, rel=1e-12)


def test_resume_through_the_api_matches_the_cli_rules(tmp_path):
    first = fedsim.run(SMALL, tmp_path / "run")
    with pytest.raises(fedsim.FedsimError, match="force= applies only with resume="):
        fedsim.run(SMALL, tmp_path / "other", force=["rounds"])
    grown = fedsim.run(resume=first.run_folder, overrides=["rounds=4"], force=["rounds"])
    assert [r["round"] for r in grown.metrics] == [1, 2, 3, 4]
    assert grown.epsilon > first.epsilon


def test_a_model_defined_outside_the_package_is_registered_and_trained(tmp_path):
    """In a fresh interpreter, as a user's script: a model class of its own, registered before
    any config is loaded, named by the config and trained; registering after the config schema
    is built, or twice, is a one-line error."""
    script = textwrap.dedent(
        f"""
        import json, torch
        import fedsim
        from fedsim.models import ModelKind

        class TwoLayer(torch.nn.Module):
            def __init__(self, in_features, num_classes, dp_layers=False):
                super().__init__()
                self.net = torch.nn.Sequential(torch.nn.Linear(in_features, 8), torch.nn.ReLU(),
                                               torch.nn.Linear(8, num_classes))
            def forward(self, x):
                return self.net(x)

        fedsim.register_model(ModelKind("my_two_layer", "vector", TwoLayer, {{}}, "a user's MLP"))
        cfg = {json.dumps(SMALL)}
        cfg["model"] = {{"name": "my_two_layer"}}
        result = fedsim.run(cfg, {str(tmp_path / "mine")!r})
        errors = []
        for kind in (ModelKind("late", "vector", TwoLayer, {{}}, "x"), ModelKind("my_two_layer", "vector", TwoLayer, {{}}, "x")):
            try:
                fedsim.register_model(kind)
            except fedsim.FedsimError as e:
                errors.append(str(e))
        print(json.dumps({{"params": result.summary["num_parameters"], "rounds": len(result.metrics), "errors": errors}}))
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["rounds"] == 2 and got["params"] == 64 * 8 + 8 + 8 * 10 + 10
    assert "after the config schema was built" in got["errors"][0]
    assert "registered twice" in got["errors"][1]
