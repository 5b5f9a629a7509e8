"""FEMNIST and CIFAR-100 loaders on fixtures in their published Hugging Face column layouts
(``flwrlabs/femnist``: image, writer_id, hsf_id, character; ``uoft-cs/cifar100``: img,
fine_label, coarse_label), saved with ``save_to_disk`` and as downloaded parquet files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from fedsim.data import data_spec, load_federated
from fedsim.data.images import FederatedImages
from fedsim.errors import FedsimError

ROOT = Path(__file__).resolve().parents[2]
FEMNIST_FEATURES = datasets.Features(
    {
        "image": datasets.Image(),
        "writer_id": datasets.Value("string"),
        "hsf_id": datasets.Value("int64"),
        "character": datasets.ClassLabel(num_classes=62),
    }
)
CIFAR_FEATURES = datasets.Features(
    {
        "img": datasets.Image(),
        "fine_label": datasets.ClassLabel(num_classes=100),
        "coarse_label": datasets.ClassLabel(num_classes=20),
    }
)


def _femnist(n: int = 240, seed: int = 0, side: int = 28) -> datasets.Dataset:
    rng = np.random.default_rng(seed)
    writers = [f"f{w:04d}_{w % 50:02d}" for w in rng.integers(0, 9, size=n)]
    writers[-1] = "f9999_99"  # a writer with one row: dropped
    pixels = rng.integers(0, 256, size=(n, side, side), dtype=np.uint8)
    return datasets.Dataset.from_dict(
        {
            "image": [Image.fromarray(p, mode="L") for p in pixels],
            "writer_id": writers,
            "hsf_id": rng.integers(0, 8, size=n).tolist(),
            "character": rng.integers(0, 62, size=n).tolist(),
        },
        features=FEMNIST_FEATURES,
    )


def _cifar(n: int, seed: int) -> datasets.Dataset:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
    return datasets.Dataset.from_dict(
        {
            "img": [Image.fromarray(p) for p in pixels],
            "fine_label": rng.integers(0, 100, size=n).tolist(),
            "coarse_label": rng.integers(0, 20, size=n).tolist(),
        },
        features=CIFAR_FEATURES,
    )


@pytest.fixture(scope="module")
def femnist_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("femnist")
    ds = _femnist()
    ds.save_to_disk(str(base / "disk"))
    (base / "parquet" / "data").mkdir(parents=True)
    ds.to_parquet(str(base / "parquet" / "data" / "train-00000-of-00001.parquet"))
    return ds, base / "disk", base / "parquet"


@pytest.fixture(scope="module")
def cifar_dir(tmp_path_factory):
    base = tmp_path_factory.mktemp("cifar")
    dd = datasets.DatasetDict({"train": _cifar(300, 1), "test": _cifar(80, 2)})
    dd.save_to_disk(str(base / "disk"))
    (base / "parquet").mkdir()
    dd["train"].to_parquet(str(base / "parquet" / "train-00000-of-00001.parquet"))
    dd["test"].to_parquet(str(base / "parquet" / "test-00000-of-00001.parquet"))
    return dd, base / "disk", base / "parquet"


def _pixels(ds, column, rows):
    return np.stack([np.asarray(ds[int(r)][column]) for r in rows])


def test_femnist_users_are_writers_split_90_10_in_stored_order(femnist_dirs, tmp_path):
    ds, disk, _ = femnist_dirs
    data = FederatedImages("femnist", disk, cache_dir=tmp_path)
    rows: dict[str, list[int]] = {}
    for i, w in enumerate(ds["writer_id"]):
        rows.setdefault(w, []).append(i)
    expected = {w: r for w, r in rows.items() if len(r) >= 2}
    assert sorted(data.names) == sorted(expected) and "f9999_99" not in data.names
    mean, std = data.mean.view(-1), data.std.view(-1)
    for u, w in enumerate(data.names):
        r = expected[w]
        k = int(np.floor(0.9 * len(r)))
        assert (data.num_train(u), data.num_test(u)) == (k, len(r) - k)
        x, y = data.train_samples(u, np.arange(k))
        raw = _pixels(ds, "image", r[:k]).astype(np.float32) / 255.0
        torch.testing.assert_close(x[:, 0], (torch.from_numpy(raw) - mean[0]) / std[0])
        assert y.tolist() == [ds[i]["character"] for i in r[:k]]
        _, yt = data.test_samples(u)
        assert yt.tolist() == [ds[i]["character"] for i in r[k:]]
    assert data.model_dims() == {"channels": 1, "size": 28, "num_classes": 62}


def test_save_to_disk_and_parquet_give_the_same_users_and_pixels(femnist_dirs, tmp_path):
    _, disk, parquet = femnist_dirs
    a = FederatedImages("femnist", disk, cache_dir=tmp_path / "a")
    b = FederatedImages("femnist", parquet, cache_dir=tmp_path / "b")
    assert a.names == b.names
    for u in range(a.population):
        xa, ya = a.train_samples(u, np.arange(a.num_train(u)))
        xb, yb = b.train_samples(u, np.arange(b.num_train(u)))
        torch.testing.assert_close(xa, xb)
        assert torch.equal(ya, yb)


def test_inputs_are_standardized_with_fixed_constants(femnist_dirs, cifar_dir, tmp_path):
    _, disk, _ = femnist_dirs
    data = FederatedImages("femnist", disk, cache_dir=tmp_path / "f")
    x, _ = data.train_samples(0, np.arange(data.num_train(0)))
    raw = torch.from_numpy(_pixels(femnist_dirs[0], "image", _rows_of(femnist_dirs[0], data.names[0])))
    raw = raw[: data.num_train(0)].float() / 255.0
    torch.testing.assert_close(x[:, 0], (raw - 0.5) / 0.5, rtol=0, atol=1e-6)
    cifar = FederatedImages("cifar100", cifar_dir[1], num_clients=4, cache_dir=tmp_path / "c")
    assert cifar.mean.view(-1).tolist() == pytest.approx([0.5071, 0.4865, 0.4409])
    assert cifar.std.view(-1).tolist() == pytest.approx([0.2673, 0.2564, 0.2762])


def _rows_of(ds, writer):
    return [i for i, w in enumerate(ds["writer_id"]) if w == writer]


def test_one_added_writer_changes_no_other_writers_inputs(tmp_path):
    """The attack: under user-level DP, adding or removing one user may change nothing but that
    user's contribution. Inputs standardized with the statistics of every user's pixels moved
    when one writer with all-white pages joined, and so did every other writer's inputs and
    update. With fixed constants each other writer's inputs are the same, bit for bit."""
    base = _femnist(n=120, seed=3)
    extra = datasets.Dataset.from_dict(
        {
            "image": [Image.fromarray(np.full((28, 28), 255, dtype=np.uint8), mode="L")] * 40,
            "writer_id": ["f7777_77"] * 40,
            "hsf_id": [0] * 40,
            "character": [1] * 40,
        },
        features=FEMNIST_FEATURES,
    )
    base.save_to_disk(str(tmp_path / "without"))
    datasets.concatenate_datasets([base, extra]).save_to_disk(str(tmp_path / "with"))
    a = FederatedImages("femnist", tmp_path / "without", cache_dir=tmp_path / "ca")
    b = FederatedImages("femnist", tmp_path / "with", cache_dir=tmp_path / "cb")
    assert set(b.names) - set(a.names) == {"f7777_77"}
    for u, name in enumerate(a.names):
        v = b.names.index(name)
        xa, ya = a.train_samples(u, np.arange(a.num_train(u)))
        xb, yb = b.train_samples(v, np.arange(b.num_train(v)))
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_cifar_partition_covers_every_row_once_and_is_seeded(cifar_dir, tmp_path):
    dd, disk, parquet = cifar_dir
    data = FederatedImages("cifar100", disk, num_clients=12, partition_alpha=0.3, seed=5, cache_dir=tmp_path)
    assert data.population == 12
    assert int(data.examples_per_user().sum()) == 300
    assert sum(data.num_test(u) for u in range(12)) == 80
    # Every train row appears once: the multiset of (label, pixel checksum) matches the split's.
    seen = []
    for u in range(12):
        x, y = data.train_samples(u, np.arange(data.num_train(u)))
        seen += list(zip(y.tolist(), x.sum(dim=(1, 2, 3)).round(decimals=2).tolist()))
    assert len(set(seen)) == len(seen) == 300
    # Test rows: contiguous near-equal shards in stored order (flwr-datasets' IidPartitioner).
    sizes = [data.num_test(u) for u in range(12)]
    assert max(sizes) - min(sizes) <= 1
    _, y0 = data.test_samples(0)
    assert y0.tolist() == dd["test"]["fine_label"][: sizes[0]]
    again = FederatedImages("cifar100", parquet, num_clients=12, partition_alpha=0.3, seed=5, cache_dir=tmp_path)
    np.testing.assert_array_equal(again.examples_per_user(), data.examples_per_user())
    other = FederatedImages("cifar100", disk, num_clients=12, partition_alpha=0.3, seed=6, cache_dir=tmp_path)
    assert not np.array_equal(other.examples_per_user(), data.examples_per_user())
    assert data.model_dims() == {"channels": 3, "size": 32, "num_classes": 100}


def test_cache_is_reused_and_invalidated_when_the_files_change(femnist_dirs, tmp_path):
    ds, _, _ = femnist_dirs
    root = tmp_path / "data"
    ds.save_to_disk(str(root))
    FederatedImages("femnist", root, cache_dir=tmp_path / "c")
    built = sorted((tmp_path / "c" / "arrays").iterdir())
    assert len(built) == 1
    stamp = (built[0] / "train_x.npy").stat().st_mtime_ns
    FederatedImages("femnist", root, cache_dir=tmp_path / "c")
    assert (built[0] / "train_x.npy").stat().st_mtime_ns == stamp
    arrow = next(root.glob("*.arrow"))
    os.utime(arrow, ns=(arrow.stat().st_atime_ns, arrow.stat().st_mtime_ns + 10**9))
    FederatedImages("femnist", root, cache_dir=tmp_path / "c")
    assert len(list((tmp_path / "c" / "arrays").iterdir())) == 2


def test_layout_errors_name_what_to_change(tmp_path):
    wrong = _femnist(20).rename_column("writer_id", "author")
    wrong.save_to_disk(str(tmp_path / "w"))
    with pytest.raises(FedsimError, match=r"lacks column\(s\) \['writer_id'\]"):
        FederatedImages("femnist", tmp_path / "w", cache_dir=tmp_path)
    datasets.DatasetDict({"train": _cifar(30, 0)}).save_to_disk(str(tmp_path / "c"))
    with pytest.raises(FedsimError, match="needs a 'test' split"):
        FederatedImages("cifar100", tmp_path / "c", num_clients=3, cache_dir=tmp_path)
    _femnist(20, side=32).save_to_disk(str(tmp_path / "big"))
    with pytest.raises(FedsimError, match="expected 28×28×1"):
        FederatedImages("femnist", tmp_path / "big", cache_dir=tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FedsimError, match="parquet"):
        FederatedImages("femnist", tmp_path / "empty", cache_dir=tmp_path)
    with pytest.raises(FedsimError, match="not a folder"):
        FederatedImages("cifar100", tmp_path / "nowhere", cache_dir=tmp_path)
    datasets.DatasetDict({"train": _cifar(30, 0), "test": _cifar(5, 1)}).save_to_disk(str(tmp_path / "small"))
    with pytest.raises(FedsimError, match="num_clients"):
        FederatedImages("cifar100", tmp_path / "small", num_clients=6, cache_dir=tmp_path)


def test_load_federated_with_max_users_keeps_a_seeded_subset(cifar_dir, tmp_path):
    _, disk, _ = cifar_dir
    spec = data_spec(
        "cifar100", max_users=5, cache_dir=str(tmp_path), root=str(disk), num_clients=12, partition_alpha=0.3
    )
    sub = load_federated(spec)
    full = load_federated(
        data_spec("cifar100", cache_dir=str(tmp_path), root=str(disk), num_clients=12, partition_alpha=0.3)
    )
    assert sub.population == 5 and set(sub.names) <= set(full.names)
    u = sub.names.index(sub.names[2])
    v = full.names.index(sub.names[2])
    torch.testing.assert_close(sub.train_samples(u, np.arange(2))[0], full.train_samples(v, np.arange(2))[0])


@pytest.mark.e2e
def test_fedsim_run_on_femnist_fixture_two_rounds(femnist_dirs, tmp_path):
    _, _, parquet = femnist_dirs
    out = tmp_path / "run"
    env = {**os.environ, "FEDSIM_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedsim.cli",
            "run",
            "--out",
            str(out),
            "--quiet",
            "--set",
            "data.name='femnist'",
            "--set",
            f"data.root='{parquet}'",
            "--set",
            "model.name='femnist_cnn_small'",
            "--set",
            "rounds=2",
            "--set",
            "sampling.scheme='poisson'",
            "--set",
            "sampling.cohort_size=4",
            "--set",
            "privacy.mechanism='gaussian'",
            "--set",
            "privacy.noise_multiplier=1.0",
            "--set",
            "client.lr=0.05",
            "--set",
            "client.batch_size=8",
            "--set",
            "eval.every=1",
            "--set",
            "sim.num_workers=2",
            "--set",
            "sim.client_cpus=1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == 2 and summary["population"] == 9
    assert 0.0 <= summary["final_eval_accuracy"] <= 1.0 and summary["majority_baseline_accuracy"] is not None


def test_a_parquet_without_the_needed_column_names_the_file(tmp_path):
    (tmp_path / "data").mkdir()
    _femnist(20).remove_columns(["character"]).to_parquet(str(tmp_path / "data" / "train-00000-of-00001.parquet"))
    with pytest.raises(
        FedsimError,
        match=r"train-00000-of-00001\.parquet: split 'train' lacks column\(s\) "
        r"\['character'\]",
    ):
        FederatedImages("femnist", tmp_path, cache_dir=tmp_path / "c")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "train-00000-of-00001.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(FedsimError, match="could not read the parquet files"):
        FederatedImages("femnist", tmp_path / "bad", cache_dir=tmp_path / "c")
