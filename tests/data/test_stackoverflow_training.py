"""Stack Overflow wired into training: the federated dataset over a generated TFF-layout folder,
the TFF models, the metrics, the config checks, and `fedsim run` on the fixture config."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsim.config import load_config
from fedsim.data import DataOptions, data_spec, load_federated
from fedsim.data.stackoverflow.database import StackOverflowDB
from fedsim.data.stackoverflow.example_proto import decode_example
from fedsim.data.stackoverflow.preprocess import NWPSpec, nwp_accuracy_counts, tag_xy
from fedsim.data.stackoverflow.synthetic import generate
from fedsim.data.stackoverflow.vocab import load_tag_vocab, load_word_vocab
from fedsim.errors import FedsimError
from fedsim.models import make_model, num_parameters

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def so_root(tmp_path_factory) -> Path:
    return generate(tmp_path_factory.mktemp("so") / "data", users=24, per_user=12, vocab=80, tags=8, seed=3)


def _spec(root: Path, name: str = "stackoverflow_nwp", **kw) -> DataOptions:
    base = dict(root=str(root), vocab_size=50, max_elements_per_user=9)
    base.update(dict(seq_len=7, num_oov_buckets=1) if name == "stackoverflow_nwp" else dict(tag_vocab_size=6))
    base.update(kw)
    return data_spec(name, **base)


def _raw(root: Path, split: str, client: str) -> list[dict]:
    conn = sqlite3.connect(root / "stackoverflow.sqlite")
    rows = conn.execute(
        "SELECT serialized_example_proto FROM examples WHERE split_name = ? AND client_id = ? ORDER BY rowid",
        (split, client),
    ).fetchall()
    conn.close()
    return [decode_example(bytes(r[0])) for r in rows]


def test_synthetic_folder_has_tff_layout_and_interleaved_rows(so_root):
    db = StackOverflowDB(so_root / "stackoverflow.sqlite")
    assert db.indexed
    stats = db.stats()
    assert stats["train"]["num_clients"] == 24 and 0 < stats["test"]["num_clients"] < 24
    conn = sqlite3.connect(so_root / "stackoverflow.sqlite")
    clients = [r[0] for r in conn.execute("SELECT client_id FROM examples WHERE split_name = 'train' ORDER BY rowid")]
    runs = sum(1 for a, b in zip(clients, clients[1:]) if a != b)
    assert runs > 24  # rows of one client are not contiguous
    assert len(load_word_vocab(so_root / "stackoverflow.word_count", None)) == 80
    assert 0 < len(load_tag_vocab(so_root / "stackoverflow.tag_count", None)) <= 8
    with pytest.raises(FedsimError, match="empty folder"):
        generate(so_root)


def test_nwp_users_are_sorted_train_clients_with_their_first_n_rows(so_root):
    data = load_federated(_spec(so_root))
    db = StackOverflowDB(so_root / "stackoverflow.sqlite")
    ids, counts = db.client_counts("train")
    assert data.names == sorted(db.clients("train")) == ids
    assert data.population == 24
    np.testing.assert_array_equal(data.examples_per_user(), np.minimum(counts, 9))
    vocab = load_word_vocab(so_root / "stackoverflow.word_count", 50)
    spec = NWPSpec(vocab, 7, 1)
    for u in (0, 5, 23):
        raw = _raw(so_root, "train", data.names[u])[:9]  # the first 9 in stored order
        x_ref, y_ref = spec.xy([r["tokens"].encode() for r in raw])
        idx = np.arange(data.num_train(u))[::-1].copy()
        x, y = data.train_samples(u, idx)
        torch.testing.assert_close(x, x_ref[idx])
        torch.testing.assert_close(y, y_ref[idx])
        assert int(x[:, 0].max()) == spec.bos and x.shape[1] == 7
    assert data.model_dims() == {"num_classes": 50 + 4}


def test_test_samples_come_from_the_test_split_of_the_same_client(so_root):
    data = load_federated(_spec(so_root))
    with_test = [u for u in range(data.population) if data.num_test(u) > 0]
    without = [u for u in range(data.population) if data.num_test(u) == 0]
    assert with_test and without
    u = with_test[0]
    raw = _raw(so_root, "test", data.names[u])
    assert data.num_test(u) == len(raw)
    spec = NWPSpec(load_word_vocab(so_root / "stackoverflow.word_count", 50), 7, 1)
    x, y = data.test_samples(u, 2)
    x_ref, _ = spec.xy([r["tokens"].encode() for r in raw[:2]])
    torch.testing.assert_close(x, x_ref)
    x0, y0 = data.test_samples(without[0], 5)
    assert x0.shape == (0, 7) and y0.shape == (0, 7)


def test_tag_samples_follow_tag_preprocessing(so_root):
    data = load_federated(_spec(so_root, "stackoverflow_tag"))
    words = {w: i for i, w in enumerate(load_word_vocab(so_root / "stackoverflow.word_count", 50))}
    tags = {t: j for j, t in enumerate(load_tag_vocab(so_root / "stackoverflow.tag_count", 6))}
    raw = _raw(so_root, "train", data.names[2])[:9]
    x, y = data.train_samples(2, np.arange(data.num_train(2)))
    for r, (xr, yr) in enumerate(zip(x, y)):
        xe, ye = tag_xy(raw[r]["tokens"].encode(), raw[r]["title"].encode(), raw[r]["tags"].encode(), words, tags)
        np.testing.assert_array_equal(xr.numpy(), xe)
        np.testing.assert_array_equal(yr.numpy(), ye)
    assert data.model_dims() == {"in_features": 50, "out_features": 6}


def test_max_users_keeps_a_seeded_subset(so_root):
    full = load_federated(_spec(so_root))
    sub = load_federated(_spec(so_root, max_users=10, subset_seed=4))
    assert sub.population == 10 and set(sub.names) < set(full.names)
    assert sub.names == sorted(sub.names)
    again = load_federated(_spec(so_root, max_users=10, subset_seed=4, seq_len=8))
    assert again.names == sub.names


def test_inconsistent_metadata_is_a_clear_error(tmp_path):
    root = generate(tmp_path / "d", users=4, per_user=5, vocab=20, tags=3)
    conn = sqlite3.connect(root / "stackoverflow.sqlite")
    conn.execute(
        "UPDATE client_metadata SET num_examples = num_examples + 3 "
        "WHERE client_id = '00000001' AND split_name = 'train'"
    )
    conn.commit()
    conn.close()
    data = load_federated(_spec(root, max_elements_per_user=1000))
    with pytest.raises(FedsimError, match="inconsistent"):
        data.train_samples(1, np.arange(2))


def test_nwp_eval_sums_mask_pad_and_match_the_three_accuracies(so_root):
    data = load_federated(_spec(so_root))
    torch.manual_seed(0)
    x, y = data.train_samples(0, np.arange(data.num_train(0)))
    out = torch.randn(*y.shape, 54)
    s = data.eval_sums(out, y)
    acc = nwp_accuracy_counts(out.argmax(-1), y, data.nwp)
    for name, (c, n) in acc.items():
        assert (s[f"acc_{name}_correct"], s[f"acc_{name}_count"]) == (c, n)
    assert (s["correct"], s["count"]) == acc["pad_oov_eos"]
    # the loss is over non-pad positions only: an independent sum of -log softmax
    logp = torch.log_softmax(out, -1)
    mask = y != 0
    ref = -logp.gather(-1, y.unsqueeze(-1)).squeeze(-1)[mask].sum()
    assert s["loss_count"] == int(mask.sum()) and s["loss_sum"] == pytest.approx(float(ref), rel=1e-5)
    assert float(data.loss(out, y)) == pytest.approx(float(ref) / int(mask.sum()), rel=1e-5)


def test_tag_eval_sums_give_precision_and_recall_at_5(so_root):
    data = load_federated(_spec(so_root, "stackoverflow_tag"))
    out = torch.tensor([[5.0, 4, 3, 2, 1, 0], [0.0, 1, 2, 3, 4, 5]])
    y = torch.tensor([[1.0, 0, 0, 0, 0, 1], [1.0, 0, 0, 0, 0, 0]])
    s = data.eval_sums(out, y)
    # row 0: top5 = tags 0..4, true {0, 5} → 1 hit; row 1: top5 = 5..1, true {0} → 0 hits
    assert s["precision_at_5_correct"] == 1 and s["precision_at_5_count"] == 10
    assert s["recall_at_5_correct"] == 1 and s["recall_at_5_count"] == 3
    bce = torch.nn.functional.binary_cross_entropy_with_logits(out, y, reduction="none").mean(1).sum()
    assert s["loss_sum"] == pytest.approx(float(bce)) and s["loss_count"] == 2


def test_model_task_mismatch_and_missing_root_are_config_errors():
    with pytest.raises(FedsimError, match="does not fit data.name"):
        load_config(None, ["data.name='stackoverflow_nwp'", "data.root='/x'"])
    with pytest.raises(FedsimError, match="needs data.root"):
        load_config(None, ["data.name='stackoverflow_tag'", "model.name='so_tag_logreg'"])
    with pytest.raises(FedsimError, match="privacy.unit = 'example' with next-word"):
        load_config(
            None,
            [
                "data.name='stackoverflow_nwp'",
                "data.root='/x'",
                "model.name='so_nwp_lstm'",
                "privacy.unit='example'",
                "privacy.example_noise_multiplier=1.0",
            ],
        )
    cfg = load_config(ROOT / "experiments/stackoverflow_nwp_dpftrl.toml", ["data.root='/x'"])
    assert cfg.sampling.cohort_size * cfg.rounds <= 342_477 and cfg.rounds == 2048
    assert cfg.data.max_elements_per_user == 256 and cfg.client.batch_size == 16
    with pytest.raises(FedsimError, match="needs data.root"):
        load_config(ROOT / "experiments/stackoverflow_nwp_mf.toml", [])


def test_missing_root_folder_names_the_files_to_get(tmp_path):
    with pytest.raises(FedsimError, match="stackoverflow"):
        load_federated(_spec(tmp_path / "nowhere"))


@pytest.mark.e2e
def test_fedsim_run_on_the_fixture_config_reports_three_nwp_accuracies(tmp_path):
    root = generate(tmp_path / "so", seed=0)
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedsim.cli",
            "run",
            str(ROOT / "experiments/stackoverflow_nwp_fixture.toml"),
            "--set",
            f"data.root='{root}'",
            "--out",
            str(out),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for key in ("eval_acc_pad", "eval_acc_pad_oov", "eval_acc_pad_oov_eos"):
        assert key in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == 2 and summary["mechanism"] == "tree" and summary["scheme"] == "single"
    m = summary["final_eval_metrics"]
    assert summary["final_eval_accuracy"] == m["eval_acc_pad_oov_eos"]
    assert all(0.0 <= m[k] <= 1.0 for k in ("eval_acc_pad", "eval_acc_pad_oov", "eval_acc_pad_oov_eos"))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["eval_acc_pad"] is not None for r in rows)
    from fedsim.privacy.ledger import recompute_epsilon

    ledger = json.loads((out / "ledger.json").read_text())
    assert summary["epsilon"] == pytest.approx(recompute_epsilon(ledger), rel=1e-9)
    assert summary["population"] == 60 and summary["num_parameters"] == num_parameters(
        make_model("so_nwp_lstm_small", {"num_classes": 150 + 4})
    )


def test_generated_folders_with_offsets_split_one_population(tmp_path):
    whole = generate(tmp_path / "whole", users=6, per_user=5, vocab=30, tags=4, seed=2)
    parts = [
        generate(tmp_path / f"p{i}", users=3, per_user=5, vocab=30, tags=4, seed=2, first_id=3 * i) for i in range(2)
    ]
    for name in ("stackoverflow.word_count", "stackoverflow.tag_count"):
        assert (parts[0] / name).read_bytes() == (parts[1] / name).read_bytes() == (whole / name).read_bytes()
    for i, part in enumerate(parts):
        db = StackOverflowDB(part / "stackoverflow.sqlite")
        ids = db.clients("train")
        assert ids == [f"{3 * i + k:08d}" for k in range(3)]
        for cid in ids:
            for split in ("train", "test"):
                assert _raw(part, split, cid) == _raw(whole, split, cid)


def test_fedsim_data_prepare_unpacks_indexes_and_verifies(tmp_path, capsys):
    import lzma
    import tarfile

    from fedsim.cli import main

    src = generate(tmp_path / "src", users=5, per_user=3, vocab=20, tags=3)
    root = tmp_path / "root"
    root.mkdir()
    conn = sqlite3.connect(src / "stackoverflow.sqlite")  # drop the index: prepare must add it
    conn.execute("DROP INDEX idx_client_id_split")
    conn.commit()
    conn.close()
    (root / "stackoverflow.sqlite.lzma").write_bytes(lzma.compress((src / "stackoverflow.sqlite").read_bytes()))
    for name in ("stackoverflow.word_count", "stackoverflow.tag_count"):
        with tarfile.open(root / f"{name}.tar.bz2", "w:bz2") as tar:
            tar.add(src / name, arcname=name)
    with pytest.warns(UserWarning, match="no \\(split_name, client_id\\) index"):
        main(["data", "prepare", "stackoverflow", "--root", str(root), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["index_created"] is True and out["splits"]["train"]["num_clients"] == 5
    assert Path(out["files"]["database"]).parent == root / ".fedsim-cache"
    assert StackOverflowDB(out["files"]["database"]).indexed
    main(["data", "prepare", "stackoverflow", "--root", str(root), "--json"])
    assert json.loads(capsys.readouterr().out)["index_created"] is False  # once
    with pytest.raises(SystemExit) as e:  # our archives are not TFF's release
        main(["data", "prepare", "stackoverflow", "--root", str(root), "--verify"])
    assert e.value.code == 2 and "differs from TFF's" in capsys.readouterr().err


def test_rows_read_ahead_are_the_rows_training_reads(so_root, monkeypatch):
    data, fresh = load_federated(_spec(so_root)), load_federated(_spec(so_root))
    data.prepare_train(5)

    def read_again(*args, **kwargs):
        raise AssertionError("user 5's rows were read from the database again")

    monkeypatch.setattr(data.db, "examples", read_again)
    idx = np.arange(data.num_train(5))[::-1].copy()
    for a, b in zip(data.train_samples(5, idx), fresh.train_samples(5, idx)):
        assert torch.equal(a, b)


def test_views_read_ahead_the_underlying_user(so_root, monkeypatch):
    from fedsim.attacks.views import without_users
    from fedsim.deploy.nodes import NodeView

    data = load_federated(_spec(so_root))
    asked: list[int] = []
    monkeypatch.setattr(data, "prepare_train", asked.append)
    without_users(data, [0, 1]).prepare_train(3)  # presented user 3 is the source's user 5
    NodeView(data, [7, 9, 11]).prepare_train(2)
    assert asked == [5, 11]
