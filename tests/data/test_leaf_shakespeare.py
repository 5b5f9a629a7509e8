"""LEAF's Shakespeare from the flwrlabs/shakespeare layout (shakespeare.csv: character_id, x, y)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from fedsim.config import load_config
from fedsim.data import load_federated, shakespeare
from fedsim.data.leaf_shakespeare import LeafShakespeare
from fedsim.errors import FedsimError


def _write_csv(path: Path, rows: list[tuple[str, str, str]], header=("character_id", "x", "y")) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def _rows(n: int = 120, width: int = 80, seed: int = 0) -> list[tuple[str, str, str]]:
    rng = np.random.default_rng(seed)
    alphabet = list("abcdefghij ,.'ABC") + ["é"]  # é is outside the vocabulary: the unknown id
    roles = ["THE_TEMPEST_PROSPERO", "HAMLET_HAMLET", "MACBETH_LADY MACBETH", "KING_LEAR_FOOL"]
    out = []
    for _ in range(n):
        text = "".join(rng.choice(alphabet, size=width + 1))
        out.append((roles[int(rng.integers(0, 4))], text[:width], text[width]))
    out.append(("OTHELLO_IAGO", "x" * width, "y"))  # one row only: dropped
    return out


@pytest.fixture(scope="module")
def leaf_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("leaf")
    rows = _rows()
    _write_csv(root / "shakespeare.csv", rows)
    return root, rows


def test_users_are_roles_split_80_20_in_stored_order(leaf_root, tmp_path):
    root, rows = leaf_root
    data = LeafShakespeare(root, cache_dir=tmp_path)
    by_role: dict[str, list[int]] = {}
    for i, (role, _, _) in enumerate(rows):
        by_role.setdefault(role, []).append(i)
    assert sorted(data.names) == sorted(r for r, idx in by_role.items() if len(idx) >= 2)
    assert data.window == 80 and data.model_dims() == {"vocab_size": shakespeare.VOCAB_SIZE}
    for u, role in enumerate(data.names):
        idx = by_role[role]
        k = int(np.floor(0.8 * len(idx)))
        assert (data.num_train(u), data.num_test(u)) == (k, len(idx) - k)
        x, y = data.train_samples(u, np.arange(k))
        for j, i in enumerate(idx[:k]):
            np.testing.assert_array_equal(x[j].numpy(), shakespeare.encode(rows[i][1]))
            assert int(y[j]) == int(shakespeare.encode(rows[i][2])[0])
        xt, _ = data.test_samples(u)
        np.testing.assert_array_equal(xt[-1].numpy(), shakespeare.encode(rows[idx[-1]][1]))
    assert any(
        int(v) == shakespeare.UNK_ID
        for u in range(data.population)
        for v in data.train_samples(u, np.arange(data.num_train(u)))[0].flatten()
    )


def test_config_and_max_users(leaf_root, tmp_path):
    root, _ = leaf_root
    cfg = load_config(None, ["data.name='shakespeare_leaf'", f"data.root='{root}'", "data.max_users=2"])
    data = load_federated(cfg.data)
    assert data.population == 2 and data.task == "char"
    with pytest.raises(FedsimError, match="needs data.root"):
        load_config(None, ["data.name='shakespeare_leaf'"])


def test_layout_errors(tmp_path):
    _write_csv(tmp_path / "a" / "shakespeare.csv", [("R", "ab", "c")], header=("user", "x", "y"))
    with pytest.raises(FedsimError, match=r"lacks column\(s\) \['character_id'\]"):
        LeafShakespeare(tmp_path / "a", cache_dir=tmp_path)
    _write_csv(tmp_path / "b" / "shakespeare.csv", [("R", "abc", "d"), ("R", "ab", "c")])
    with pytest.raises(FedsimError, match="string of 3 characters"):
        LeafShakespeare(tmp_path / "b", cache_dir=tmp_path)
    _write_csv(tmp_path / "c" / "shakespeare.csv", [("R", "abc", "de")])
    with pytest.raises(FedsimError, match="one character"):
        LeafShakespeare(tmp_path / "c", cache_dir=tmp_path)
