"""End-to-end: the real Flower simulation engine on Ray, real Shakespeare users, small model.

Each test starts Ray (≈15–30 s on 2 cores); they are marked ``e2e``.
"""

from __future__ import annotations

import json

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import PLDAccountant

from fedsim.checkpoint import load_checkpoint
from fedsim.config import load_config
from fedsim.privacy.ledger import recompute_epsilon
from fedsim.runner import model_sha256, prepare

pytestmark = pytest.mark.e2e

BASE = [
    "rounds=3",
    "sampling.scheme='poisson'",
    "privacy.mechanism='gaussian'",
    "model.name='shakespeare_lstm_small'",
    "data.max_users=30",
    "sampling.cohort_size=8",
    "client.max_examples=16",
    "client.batch_size=8",
    "eval.every=1",
    "eval.max_users=8",
    "eval.max_examples_per_user=8",
    "sim.num_workers=2",
    "sim.client_cpus=1",
]


def _rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_run_folder_ledger_and_epsilon(tmp_path):
    from fedsim.runner import run_experiment

    cfg = load_config(None, BASE + ["privacy.noise_multiplier=1.3"])
    out = tmp_path / "run"
    summary = run_experiment(cfg, out, progress=False)

    for name in (
        "config.toml",
        "metrics.jsonl",
        "ledger.json",
        "summary.json",
        "checkpoint/checkpoint.pt",
        "plots/accuracy.png",
        "plots/epsilon.png",
    ):
        assert (out / name).exists(), name

    rows = _rows(out)
    assert [r["round"] for r in rows] == [1, 2, 3]
    for r in rows:
        for key in ("epsilon", "train_loss", "eval_accuracy", "dropped_updates", "cohort_size", "seconds"):
            assert key in r, key
        assert r["dropped_updates"] == 0
        assert 0.0 <= r["eval_accuracy"] <= 1.0

    # ε equals dp-accounting computed directly for the same events.
    N, K, z = 30, 8, 1.3
    delta = 1 / N**1.1
    for r in rows:
        acc = PLDAccountant()
        acc.compose(
            dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(K / N, dp_event.GaussianDpEvent(z)), r["round"])
        )
        assert r["epsilon"] == pytest.approx(acc.get_epsilon(delta), rel=1e-8)

    ledger = json.loads((out / "ledger.json").read_text())
    assert len(ledger["entries"]) == 3
    assert ledger["spec"]["population"] == N and ledger["spec"]["noise_multiplier"] == z
    assert recompute_epsilon(ledger) == pytest.approx(summary["epsilon"], rel=1e-8)
    assert summary["epsilon"] == pytest.approx(rows[-1]["epsilon"])
    assert summary["rounds_completed"] == 3 and summary["population"] == N
    assert summary["delta"] == pytest.approx(delta)
    assert summary["final_eval_accuracy"] == rows[-1]["eval_accuracy"]

    # The checkpoint holds every stateful piece and matches the final model hash.
    ckpt = load_checkpoint(out / "checkpoint")
    assert ckpt["server"]["round"] == 3
    assert model_sha256(ckpt["server"]["params"]) == summary["model_sha256"]
    assert set(ckpt) >= {"server", "sampler", "metrics_rows"}
    assert set(ckpt["server"]) >= {"params", "optimizer", "noise", "ledger"}

    # The model moved, and not by more than the DP bound allows in expectation-free terms:
    # with lr = 1, ‖x3 − x0‖ ≤ Σ_t (accepted_t·c + ‖noise_t‖)/K̄ — checked loosely via finiteness.
    x0 = prepare(cfg).x0
    assert torch.isfinite(ckpt["server"]["params"]).all()
    assert not torch.equal(ckpt["server"]["params"], x0)


def test_hostile_clients_are_dropped_or_reclipped(tmp_path):
    """Six workers: NaN, wrong shape, int dtype, no arrays record, 1e6-norm and honest. With no
    noise and server SGD at lr 1, each round moves the model by at most (accepted users · c)/K̄."""
    from fedsim.clients.faults import make_faulty_client_app
    from fedsim.runner import run_experiment

    cfg = load_config(
        None,
        [b for b in BASE if not b.startswith("sim.")]
        + [
            "privacy.mechanism='none'",
            "sampling.scheme='fixed'",
            "sampling.cohort_size=12",
            "sim.num_workers=6",
            "sim.client_cpus=0.5",
            "checkpoint.every=1",
            "rounds=2",
        ],
    )
    out = tmp_path / "hostile"
    app = make_faulty_client_app({0: "nan", 1: "shape", 2: "huge", 3: "dtype", 4: "noarrays"})
    run_experiment(cfg, out, progress=False, client_app=app)
    rows = _rows(out)
    assert len(rows) == 2
    for r in rows:
        reasons = r["drop_reasons"]
        assert reasons["nonfinite"] == 1 and reasons["shape"] == 1
        assert reasons["dtype"] == 1 and reasons["missing"] == 1
        assert r["dropped_replies"] == 4
        assert r["dropped_updates"] == 8  # 12 users over 6 workers: 2 users per dropped reply
        assert r["server_reclipped"] == 1  # the 1e6-norm reply was re-clipped to 2·c
        assert r["accepted_updates"] == 4
        assert r["epsilon"] == "inf"
    x = load_checkpoint(out / "checkpoint")["server"]["params"]
    x0 = prepare(cfg).x0
    bound = sum(r["accepted_updates"] for r in rows) * cfg.client.clip_norm / cfg.sampling.cohort_size
    assert float(torch.linalg.vector_norm((x - x0).double())) <= bound * (1 + 1e-6)
    assert torch.isfinite(x).all()


@pytest.mark.slow  # over 30 s in the default suite (CI time); make test-slow runs it
def test_slow_client_past_the_round_timeout_is_counted_missing(tmp_path):
    """One worker answers round 2 fifty seconds late (timeout 40 s, twenty times a quiet machine's
    round, so a loaded machine's healthy worker still makes it): that round completes
    without it (counted as missing), the late reply is never used, the next round has it back,
    and ε is the one dp-accounting gives for the sampled rounds."""
    from fedsim.clients.faults import SLOW_ROUND, make_faulty_client_app
    from fedsim.runner import run_experiment

    cfg = load_config(
        None,
        [b for b in BASE if not b.startswith("sim.")]
        + [
            "sampling.scheme='fixed'",
            "sampling.cohort_size=8",
            "privacy.noise_multiplier=1.0",
            "sim.num_workers=2",
            "sim.client_cpus=1",
            "rounds=3",
            "eval.every=0",
            "sim.round_timeout=40",
        ],
    )
    out = tmp_path / "slow"
    run_experiment(cfg, out, progress=False, client_app=make_faulty_client_app({0: "slow"}))
    rows = _rows(out)
    assert [r["drop_reasons"]["missing"] for r in rows] == [1 if i == SLOW_ROUND else 0 for i in range(3)]
    assert rows[SLOW_ROUND]["accepted_updates"] + rows[SLOW_ROUND]["dropped_updates"] == 8
    assert rows[SLOW_ROUND]["dropped_updates"] > 0
    assert all(r["drop_reasons"]["stale"] == 0 and r["drop_reasons"]["duplicate"] == 0 for r in rows)
    from fedsim.privacy.accounting import epsilon
    from fedsim.runner import resolve_privacy

    assert rows[-1]["epsilon"] == pytest.approx(epsilon(resolve_privacy(cfg, 30), 3), rel=1e-9)


def test_client_exceptions_and_wrong_user_claims_are_dropped(tmp_path):
    """An exception inside one node's ClientApp and a reply that claims other users than
    the ones assigned: both dropped and counted; the round completes; ε is unaffected."""
    from fedsim.clients.faults import make_faulty_client_app
    from fedsim.runner import run_experiment

    cfg = load_config(
        None,
        [b for b in BASE if not b.startswith("sim.")]
        + [
            "sampling.scheme='fixed'",
            "sampling.cohort_size=12",
            "privacy.noise_multiplier=1.0",
            "sim.num_workers=4",
            "sim.client_cpus=0.5",
            "rounds=2",
            "eval.every=0",
        ],
    )
    out = tmp_path / "faults"
    run_experiment(cfg, out, progress=False, client_app=make_faulty_client_app({0: "error", 1: "users"}))
    rows = _rows(out)
    assert len(rows) == 2
    for r in rows:
        assert r["drop_reasons"]["client_error"] == 1
        assert r["drop_reasons"]["unexpected_users"] == 1
        assert r["dropped_updates"] == 6 and r["accepted_updates"] == 6
    from fedsim.privacy.accounting import epsilon
    from fedsim.runner import resolve_privacy

    spec = resolve_privacy(cfg, 30)
    assert rows[-1]["epsilon"] == pytest.approx(epsilon(spec, 2), rel=1e-9)


def test_too_few_valid_replies_stops_the_run_before_noise(tmp_path):
    """Three of four nodes send garbage and sim.min_valid_replies = 2: round 1 fails loudly
    with a FedsimError, nothing is recorded in the ledger, and no round is written."""
    from fedsim.clients.faults import make_faulty_client_app
    from fedsim.errors import FedsimError
    from fedsim.runner import run_experiment

    cfg = load_config(
        None,
        [b for b in BASE if not b.startswith("sim.")]
        + [
            "sampling.scheme='fixed'",
            "sampling.cohort_size=12",
            "privacy.noise_multiplier=1.0",
            "sim.num_workers=4",
            "sim.client_cpus=0.5",
            "sim.min_valid_replies=2",
            "rounds=2",
        ],
    )
    out = tmp_path / "stopped"
    with pytest.raises(FedsimError, match="min_valid_replies"):
        run_experiment(cfg, out, progress=False, client_app=make_faulty_client_app({0: "nan", 1: "shape", 2: "error"}))
    assert _rows(out) == []
    assert not (out / "summary.json").exists()
