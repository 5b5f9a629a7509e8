"""``data.name = "table"``: a user's own parquet table, with a user column (natural users) and
with a Flower Datasets Dirichlet partitioner (synthetic users), trained 3 rounds from the CLI and
from Python; the header and the ledger say when users are partitions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import fedsim
from fedsim.data.table import LocalTable, TableOptions
from fedsim.privacy.ledger import recompute_epsilon

USERS, ROWS = 30, 900


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, ROWS)
    x = rng.normal(0, 1, (ROWS, 3)) + np.eye(3)[y] * 2
    path = tmp_path_factory.mktemp("table") / "mine.parquet"
    pq.write_table(
        pa.table({"author": [f"a{i % USERS:02d}" for i in range(ROWS)], "f0": x[:, 0], "f1": x[:, 1], "f2": x[:, 2],
                  "kind": np.array(["cat", "dog", "eel"])[y]}),
        path,
    )  # fmt: skip
    return path


def _cfg(table: Path, **data) -> dict:
    return {
        "rounds": 3,
        "data": {"name": "table", "root": str(table), "features": ["f0", "f1", "f2"], "label": "kind", **data},
        "model": {"name": "logreg"},
        "sampling": {"scheme": "poisson", "cohort_size": 5},
        "privacy": {"mechanism": "gaussian", "noise_multiplier": 1.0},
        "eval": {"every": 0},
        "sim": {"engine": "inprocess", "num_workers": 1},
    }


def test_users_from_a_column_and_from_a_dirichlet_partitioner(table):
    natural = LocalTable(TableOptions(root=str(table), features=["f0", "f1", "f2"], label="kind", user_column="author"))
    assert natural.population == USERS and natural.names[0] == "a00" and natural.vocab_size == 3
    assert sum(natural.num_train(u) + natural.num_test(u) for u in range(USERS)) == ROWS
    assert natural.num_test(0) == round(0.2 * ROWS / USERS)
    parts = LocalTable(TableOptions(root=str(table), features=["f0", "f1", "f2"], label="kind",
                                    partitioner="dirichlet", num_partitions=12, alpha=0.3))  # fmt: skip
    assert parts.population == 12 and sum(parts.num_train(u) + parts.num_test(u) for u in range(12)) == ROWS
    mixes = [np.bincount(parts.y[parts._train[u]].numpy(), minlength=3) / parts.num_train(u) for u in range(12)]
    assert max(m.max() for m in mixes) > 0.6  # α = 0.3: skewed label mixes
    with pytest.raises(fedsim.FedsimError, match="user_column .* or data.partitioner"):
        fedsim.load_config(_cfg(table))


@pytest.mark.parametrize("users", [{"user_column": "author"}, {"partitioner": "dirichlet", "num_partitions": 12}])
def test_three_rounds_from_python_and_from_the_cli(table, tmp_path, users):
    result = fedsim.run(_cfg(table, **users), tmp_path / "py")
    assert len(result.metrics) == 3
    assert result.summary["population"] == (USERS if "user_column" in users else 12)
    ledger = json.loads((result.run_folder / "ledger.json").read_text())
    assert result.epsilon == pytest.approx(recompute_epsilon(ledger))
    partition_note = any("NO GUARANTEE for the people or rows" in n for n in ledger["notes"])
    assert partition_note == ("partitioner" in users)
    cfg_file = tmp_path / "mine.toml"
    import tomli_w

    cfg_file.write_text(tomli_w.dumps(_cfg(table, **users)))
    r = subprocess.run([sys.executable, "-m", "fedsim.cli", "run", str(cfg_file), "--out", str(tmp_path / "cli")],
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert ("NO GUARANTEE for the people or rows" in r.stdout + r.stderr) == ("partitioner" in users)
    assert json.loads((tmp_path / "cli" / "summary.json").read_text())["rounds_completed"] == 3


def test_users_without_test_rows_are_evaluated_as_nothing_not_as_failures(table, tmp_path):
    """``test_fraction = 0``: every evaluation reply is valid and holds no sample; the rows say
    there is no accuracy, and count no failed evaluation reply (they used to count every one)."""
    cfg = _cfg(table, user_column="author", test_fraction=0.0)
    cfg["eval"] = {"every": 1}
    result = fedsim.run(cfg, tmp_path / "run")
    for row in result.metrics:
        assert row["eval_accuracy"] is None and not row.get("eval_failed_replies")
