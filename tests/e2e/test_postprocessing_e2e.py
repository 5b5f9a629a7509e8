"""Real Ray runs (2 rounds) with every filter, every server optimizer and every error-feedback
mode: the ledger's ε is the same for all of them and equals dp-accounting's (post-processing
and error feedback do not change the accounting), and each piece really ran."""

from __future__ import annotations

import json

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import PLDAccountant

from fedsim.checkpoint import load_checkpoint
from fedsim.config import load_config
from fedsim.privacy.ledger import recompute_epsilon

pytestmark = pytest.mark.e2e

N, K, Z = 30, 6, 1.1
BASE = [
    "rounds=2",
    "sampling.scheme='poisson'",
    "privacy.mechanism='gaussian'",
    f"privacy.noise_multiplier={Z}",
    "model.name='shakespeare_lstm_small'",
    f"data.max_users={N}",
    f"sampling.cohort_size={K}",
    "client.max_examples=8",
    "eval.every=0",
    "eval.max_users=4",
    "eval.max_examples_per_user=4",
    "sim.num_workers=2",
]

#: (filter, server optimizer, error feedback): every filter, optimizer and EF mode appears.
COMBOS = [
    (["filter.name='doppler'", "filter.preset='second_order'", "filter.trace_coordinates=16"], "adambc", "client"),
    (["filter.name='ema'"], "yogi", "server"),
    (["filter.name='disk'", "filter.mode='two_point'"], "adam", "none"),
    (["filter.name='disk'", "filter.mode='lookahead'"], "sgd", "client"),
    ([], "momentum", "none"),
]


def _expected_eps(rounds: int) -> float:
    acc = PLDAccountant()
    acc.compose(
        dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(K / N, dp_event.GaussianDpEvent(Z)), rounds)
    )
    return acc.get_epsilon(1 / N**1.1)


@pytest.mark.parametrize("filt,opt,ef", COMBOS, ids=[f"{c[1]}-{c[2]}-{(c[0] or ['none'])[0]}" for c in COMBOS])
def test_epsilon_is_post_processing_invariant(tmp_path, filt, opt, ef):
    from fedsim.runner import run_experiment

    extra = ["privacy.allow_no_guarantee=true"] if ef == "server" else []
    cfg = load_config(None, BASE + filt + extra + [f"server.optimizer='{opt}'", f"client.error_feedback='{ef}'"])
    out = tmp_path / "run"
    summary = run_experiment(cfg, out, progress=False)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    ledger = json.loads((out / "ledger.json").read_text())
    for r in rows:
        # server error feedback has no guarantee: ε = ∞ (tests/redteam/test_server_ef.py)
        assert r["epsilon"] == ("inf" if ef == "server" else pytest.approx(_expected_eps(r["round"]), rel=1e-8))
        assert r["dropped_updates"] == 0
    assert recompute_epsilon(ledger) == (float("inf") if ef == "server" else pytest.approx(_expected_eps(2), rel=1e-8))
    ckpt = load_checkpoint(out / "checkpoint")
    srv = ckpt["server"]

    c1 = cfg.client.clip_norm
    if ef == "client":
        # Users that trained carry their error state into their next participation.
        assert summary["error_feedback"] == "client"
        st = ckpt["client_state"]
        assert 0 < len(st["users"]) <= sum(r["accepted_updates"] for r in rows)
        assert float(st["states"].abs().sum()) > 0
        assert rows[0]["server_reclipped"] == 0  # messages ≤ c₁ + c₂ pass the server's bound
    elif ef == "server":
        assert float(srv["error_feedback"]["e"].norm()) > 0
        assert any("NO PRIVACY GUARANTEE" in n for n in ledger["notes"]) and summary["notes"]
    else:
        assert ckpt["client_state"] is None and srv["error_feedback"] is None
    if "two_point" in " ".join(filt):
        assert [r["client_evaluations_per_user"] for r in rows] == [2, 2]
    if filt and "disk" in filt[0]:
        assert float(srv["last_step"].norm()) > 0  # d_{t−1} was tracked and sent
    assert summary["rounds_completed"] == 2 and c1 > 0
    if any("trace_coordinates" in f for f in filt):
        import numpy as np

        tr = np.load(out / "filter_trace.npz")
        assert tr["before"].shape == tr["after"].shape == (2, 16)
        assert not np.array_equal(tr["before"], tr["after"])  # the filter acted
        assert (out / "plots" / "psd.png").exists()
