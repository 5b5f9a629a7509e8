"""Client error feedback's opt-in kept-state options (``client.ef_state_bound`` ``B``,
``client.ef_decay`` ``β``; docs/algorithms.md §8): the rule by hand, the message bound under
adversarial inputs, the defaults unchanged, the store and the config."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsim.config import load_config
from fedsim.errors import FedsimError
from fedsim.training.error_feedback import ClientStateStore, client_ef_update, kept_state

C1, C2 = 0.5, 1.0
E = torch.tensor([3.0, 4.0], dtype=torch.float64)  # ‖e‖ = 5
DELTA = torch.tensor([1.0, 0.0], dtype=torch.float64)
# by hand: clip(Δ, 0.5) = (0.5, 0); clip(e, 1) = (0.6, 0.8); u = (1.1, 0.8); e + Δ − u = (2.9, 3.2)
U = [1.1, 0.8]
E_NEW = [2.9, 3.2]
NORM = math.sqrt(2.9**2 + 3.2**2)


@pytest.mark.parametrize(
    ("bound", "decay", "kept"),
    [
        (None, None, E_NEW),
        (2.0, None, [2.9 * 2 / NORM, 3.2 * 2 / NORM]),
        (10.0, None, E_NEW),  # inside the bound: kept whole
        (None, 0.5, [1.45, 1.6]),
        (2.0, 0.5, [1.45 * 2 / (NORM / 2), 1.6 * 2 / (NORM / 2)]),  # decay first, then the bound
        (None, 1.0, E_NEW),
    ],
)
def test_kept_state_rule_by_hand(bound, decay, kept):
    u, e_new, norm = client_ef_update(DELTA, E, C1, C2, bound=bound, decay=decay)
    np.testing.assert_allclose(u.numpy(), U, rtol=0, atol=1e-12)  # the message ignores the options
    np.testing.assert_allclose(e_new.numpy(), kept, rtol=0, atol=1e-12)
    assert norm == 1.0


def test_defaults_are_the_unchanged_recursion_bit_for_bit():
    g = torch.Generator().manual_seed(1)
    e = torch.zeros(300)
    for _ in range(10):
        delta = torch.randn(300, generator=g) * 3
        u, e_new, _ = client_ef_update(delta, e, 0.5, 0.8)
        assert torch.equal(e_new, e + delta - u)  # the recursion before the options existed
        for kw in ({"bound": None}, {"decay": None}, {"bound": None, "decay": 1.0}):
            u2, e2, _ = client_ef_update(delta, e, 0.5, 0.8, **kw)
            assert torch.equal(u2, u) and torch.equal(e2, e_new)
        e = e_new
    store = ClientStateStore(dim=3, population=4, budget_mb=1)
    value = np.array([1e30, -2.5, 7.0], dtype=np.float32)
    store.put(1, value)
    assert store.get(1).tobytes() == value.tobytes()


ADVERSARIAL = [
    torch.full((5,), 1e30),
    torch.full((5,), -3e38),
    torch.tensor([float("nan"), 1.0, 0.0, 0.0, 0.0]),
    torch.tensor([float("inf"), 0.0, 0.0, 0.0, 0.0]),
    torch.tensor([1e-30, 0.0, 0.0, 0.0, 0.0]),
]


@pytest.mark.parametrize("delta", ADVERSARIAL)
@pytest.mark.parametrize("state", [torch.zeros(5), torch.full((5,), 1e30), torch.full((5,), -7.0)])
@pytest.mark.parametrize(("bound", "decay"), [(None, None), (0.3, None), (None, 0.5), (2.0, 0.9)])
def test_message_is_bounded_by_c1_plus_c2_whatever_the_delta_and_state(delta, state, bound, decay):
    u, e_new, _ = client_ef_update(delta, state, C1, C2, bound=bound, decay=decay)
    assert bool(torch.isfinite(u).all())
    assert float(u.double().norm()) <= C1 + C2
    kept = e_new.double()
    if bool(torch.isfinite(kept).all()):
        if bound is not None:
            assert float(kept.norm()) <= bound
    else:
        # a non-finite new state stays non-finite (not zeroed by the clip): the caller counts the
        # user as failed, sends nothing of it and keeps its old state (fedsim.training.local)
        assert not bool(torch.isfinite(delta).all()) or not bool(torch.isfinite(state + delta).all())


def test_kept_state_leaves_a_non_finite_state_visible():
    bad = torch.tensor([float("nan"), 1.0])
    assert not bool(torch.isfinite(kept_state(bad, bound=1.0, decay=0.5)).all())


def test_saturated_user_state_grows_without_a_bound_and_stays_bounded_with_one():
    # a user whose delta is always 5 (> c₁ + c₂ = 1.5): without options e grows by 3.5 per
    # participation and clip(e, c₂) = c₂ from the second one on; with B = c₂ it stays at c₂, and
    # the messages are the same
    delta = torch.tensor([5.0], dtype=torch.float64)
    for bound, last in ((None, 4.5 + 5 * 3.5), (C2, C2)):
        e = torch.zeros(1, dtype=torch.float64)
        msgs = []
        for _ in range(6):
            u, e, _ = client_ef_update(delta, e, C1, C2, bound=bound)
            msgs.append(float(u[0]))
        assert msgs == pytest.approx([C1] + [C1 + C2] * 5)
        assert float(e[0]) == pytest.approx(last)


def test_store_keeps_the_rule_once_and_resumes_as_kept():
    store = ClientStateStore(dim=2, population=4, budget_mb=1, bound=2.0, decay=0.5)
    store.put(0, np.array(E_NEW, dtype=np.float32))
    kept = store.get(0)
    np.testing.assert_allclose(kept, [1.45 * 2 / (NORM / 2), 1.6 * 2 / (NORM / 2)], rtol=1e-6)
    resumed = ClientStateStore(dim=2, population=4, budget_mb=1, bound=2.0, decay=0.5)
    resumed.load_state_dict(store.state_dict())
    assert resumed.get(0).tobytes() == kept.tobytes()  # not decayed or clipped a second time
    with pytest.raises(ValueError, match="not finite"):
        store.put(1, np.array([np.nan, 0.0], dtype=np.float32))


def test_config_options_are_opt_in_and_only_for_client_error_feedback():
    cfg = load_config(None)
    assert cfg.client.ef_state_bound is None and cfg.client.ef_decay is None
    cfg = load_config(None, ["client.error_feedback='client'", "client.ef_state_bound=2.0", "client.ef_decay=0.9"])
    assert (cfg.client.ef_state_bound, cfg.client.ef_decay) == (2.0, 0.9)
    for bad in ("client.ef_state_bound=1.0", "client.ef_decay=0.5"):
        with pytest.raises(FedsimError, match="error_feedback = 'client'"):
            load_config(None, [bad])
    for bad in ("client.ef_decay=0", "client.ef_decay=1.5", "client.ef_state_bound=0"):
        with pytest.raises(FedsimError):
            load_config(None, ["client.error_feedback='client'", bad])


def test_a_run_keeps_the_bounded_states(tmp_path):
    # the options reach the simulator's store, and every state kept after a run is within B (the
    # users' deltas at client.lr = 2.0 are far above c₁ + c₂ = 0.2, so unbounded states would grow)
    from fedsim.runner import run_experiment
    from fedsim.runner.callbacks import RunCallback

    class Keep(RunCallback):
        def on_start(self, run, out, resumed):
            self.run = run

    keep = Keep()
    sets = [
        "rounds=3",
        "data.max_users=12",
        "sampling.scheme='poisson'",
        "sampling.cohort_size=6",
        "privacy.mechanism='gaussian'",
        "privacy.noise_multiplier=1.0",
        "client.max_examples=8",
        "client.clip_norm=0.1",
        "client.error_feedback='client'",
        "client.ef_state_bound=0.05",
        "client.ef_decay=0.9",
        "eval.every=0",
        "eval.max_users=2",
        "sim.num_workers=1",
        "sim.engine='inprocess'",
    ]
    run_experiment(load_config(None, sets), tmp_path / "run", progress=False, callbacks=[keep])
    store = keep.run.client_store
    assert (store.bound, store.decay) == (0.05, 0.9)
    assert store.states, "no user took part"
    assert max(float(np.linalg.norm(e.astype(np.float64))) for e in store.states.values()) <= 0.05
