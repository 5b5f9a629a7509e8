"""User code that fails for every user is loud (issue 44, part 5).

On the previous main a hook that raised for every user, or a model whose forward returned the
wrong shape, finished "successfully" (exit 0, failed_users = the whole cohort every round, the
exception text nowhere), and `register_local_update("x", 42)` was accepted. Now the first traceback
of each kind is shown on the terminal and written to the run folder, a round in which every
sampled user failed in code stops the run before its noise with a non-zero exit, and the run
resumes once the code is fixed. A user whose data fails alone is still isolated and counted.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedsim.errors import FedsimError
from fedsim.training.local_updates import LOCAL_UPDATES, register_local_update

CONFIG = """
name = "failing_code"
plugins = ["parts.py"]
rounds = 3
[data]
name = "synthetic"
num_clients = 20
[model]
name = "logreg"
[client]
local_update = "mine"
[sampling]
scheme = "fixed"
cohort_size = 6
[privacy]
mechanism = "gaussian"
noise_multiplier = 1.0
[eval]
every = 0
[sim]
engine = "inprocess"
num_workers = 1
"""

PARTS = """
import os, torch, fedsim

calls = [0]


def mine(model, batches, loss, spec):
    calls[0] += 1  # a test's counter (no user data): fedsim's two probe calls and round 1's 6 users
    if os.environ.get("BROKEN") == "1" and calls[0] > 8:  # train, then the bug bites
        raise RuntimeError("my hook is broken: forgot to unpack the batch")
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr)
    for x, y in batches:
        opt.zero_grad(); loss(model(x), y).backward(); opt.step()
    return 0.0

fedsim.register_local_update("mine", mine)
"""


def _fedsim(args: list[str], folder: Path, broken: bool) -> subprocess.CompletedProcess[str]:
    import os

    env = dict(os.environ, BROKEN="1" if broken else "0")
    return subprocess.run(
        [sys.executable, "-m", "fedsim.cli", *args], capture_output=True, text=True, cwd=folder, env=env, timeout=600
    )


def test_a_hook_that_fails_for_everyone_stops_the_run_and_resumes_once_fixed(tmp_path):
    (tmp_path / "exp.toml").write_text(CONFIG, encoding="utf-8")
    (tmp_path / "parts.py").write_text(PARTS, encoding="utf-8")
    out = tmp_path / "run"
    r = _fedsim(["run", "exp.toml", "--out", str(out)], tmp_path, broken=True)
    text = r.stdout + r.stderr
    assert r.returncode != 0, text[-3000:]
    assert "every sampled user's local training failed in your code" in text
    assert "Traceback (most recent call last)" in text and "my hook is broken" in text
    log = (out / "failures.log").read_text(encoding="utf-8")
    assert "Traceback (most recent call last)" in log and "my hook is broken" in log
    # round 1 completed; round 2 stopped before its noise, so its row and its ε were never written
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert len(rows) == 1 and rows[0]["failed_users"] == 0
    assert f"fedsim run --resume {out}" in text
    fixed = _fedsim(["run", "--resume", str(out)], tmp_path, broken=False)
    assert fixed.returncode == 0, (fixed.stdout + fixed.stderr)[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert len(rows) == 3 and all(row["failed_users"] == 0 for row in rows)
    ledger = json.loads((out / "ledger.json").read_text())
    assert len(ledger["entries"]) == 3


def test_a_model_with_the_wrong_output_stops_the_run(tmp_path):
    """The model's forward gives the wrong shape for the loss: a code failure for every user."""
    parts = textwrap.dedent(
        """
        import torch, fedsim
        from fedsim.models import ModelKind

        class Flat(torch.nn.Module):
            def __init__(self, in_features, num_classes, dp_layers=False):
                super().__init__()
                self.fc = torch.nn.Linear(in_features, num_classes)
            def forward(self, x):
                return self.fc(x).sum()  # a scalar, not (batch, classes)

        fedsim.register_model(ModelKind("flat", "vector", Flat, {}, "a model with the wrong output"))
        """
    )
    (tmp_path / "parts.py").write_text(parts, encoding="utf-8")
    cfg = CONFIG.replace('name = "logreg"', 'name = "flat"').replace('local_update = "mine"\n', "")
    (tmp_path / "exp.toml").write_text(cfg, encoding="utf-8")
    r = _fedsim(["run", "exp.toml", "--out", str(tmp_path / "run")], tmp_path, broken=False)
    text = r.stdout + r.stderr
    assert r.returncode != 0, text[-3000:]
    assert ("every sampled user's local training failed in your code" in text) or ("model" in text.lower())
    assert "fedsim: internal error" not in text


def test_one_users_bad_data_is_still_isolated():
    """A data read that raises is a data failure: counted, no traceback, no stop."""
    import torch

    from fedsim.data.synthetic import SyntheticClassification
    from fedsim.training.local import LocalTraining, train_users

    class OneBad(SyntheticClassification):
        def train_samples(self, u, idx):
            if u == 2:
                raise OSError("user 2's file is unreadable")
            return super().train_samples(u, idx)

    data = OneBad(6, 8, 5, 3)
    model = torch.nn.Linear(5, 3)
    x0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    spec = LocalTraining(epochs=1, batch_size=4, lr=0.1, max_examples=8, clip_norm=1.0)
    _, results = train_users(model, x0, data, [0, 1, 2, 3], 0, 0, spec)
    assert [r.failed for r in results] == [False, False, True, False]
    assert results[2].code_error is None


def test_a_failing_forward_keeps_its_traceback():
    import torch

    from fedsim.data.synthetic import SyntheticClassification
    from fedsim.training.local import LocalTraining, train_users

    class Broken(torch.nn.Linear):
        def forward(self, x):
            raise ValueError("shapes do not match in my layer")

    data = SyntheticClassification(6, 8, 5, 3)
    model = Broken(5, 3)
    x0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    spec = LocalTraining(epochs=1, batch_size=4, lr=0.1, max_examples=8, clip_norm=1.0)
    _, results = train_users(model, x0, data, [0, 1], 0, 0, spec)
    assert all(r.failed and r.code_error and "shapes do not match in my layer" in r.code_error for r in results)
    assert "Traceback (most recent call last)" in str(results[0].code_error)


@pytest.mark.parametrize(
    ("update", "words"),
    [(42, "not callable"), ("f", "not callable"), (lambda model, batches: 0.0, "cannot be called as")],
    ids=["int", "str", "two_params"],
)
def test_registering_something_that_is_not_a_local_update_is_refused(update, words):
    with pytest.raises(FedsimError, match=words):
        register_local_update("not_a_hook", update)
    assert "not_a_hook" not in LOCAL_UPDATES
