"""Red team, findings 3 and 4: the noise (and the example-level noise) could be regenerated.

Before: ``torch.Generator().manual_seed(s)`` keeps only the low 32 bits of ``s``, so a node that
sees ``x_t`` could search 2³² seeds and subtract the noise; the example-level DP-SGD noise was
seeded from the public config seed. Now every DP draw is AES-256-CTR under a 256-bit key."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsim.privacy.noise import gaussian_noise
from fedsim.privacy.rng import KEY_BYTES, PrivacyKey
from fedsim.seeding import derive_seed

D = 4096


def _residual(candidate: torch.Tensor, target: torch.Tensor) -> float:
    """Relative residual ‖target − candidate‖² / ‖target‖²: 0 for the right noise, ≈ 2 for an
    independent draw."""
    return float(((target - candidate) ** 2).sum() / (target**2).sum())


def test_seeds_differing_only_in_high_bits_give_different_noise():
    rows = [gaussian_noise(D, PrivacyKey.from_seed(s).derive("noise")).row(0) for s in (7, 7 + 2**32, 7 + 2**62)]
    assert not torch.equal(rows[0], rows[1]) and not torch.equal(rows[0], rows[2])
    assert min(_residual(rows[0], r) for r in rows[1:]) > 1.5
    # torch's generator, for contrast, collapses exactly those seeds (the old weakness)
    g = [torch.randn(8, generator=torch.Generator().manual_seed(s)) for s in (7, 7 + 2**32)]
    assert torch.equal(g[0], g[1])


def test_a_search_over_32_bit_seeds_does_not_reproduce_a_rounds_noise():
    key = PrivacyKey.from_seed(0).derive("noise")
    target = gaussian_noise(D, key).row(3)
    # every candidate the old attack would try first: the low 32 bits of the config seed and of
    # the derived seeds the old code used, then a sweep of low seeds
    old_style = [derive_seed(0, "noise-base"), derive_seed(derive_seed(0, "noise-base"), "noise", 3), 0, 3]
    candidates = old_style + list(range(2000))
    best = min(
        _residual(torch.randn(D, generator=torch.Generator().manual_seed(s & 0xFFFFFFFF)), target) for s in candidates
    )
    assert best > 1.5  # nothing close; the right key gives 0
    assert _residual(gaussian_noise(D, key).row(3), target) == 0.0
    # the stream's state is the full key: 256 bits, and flipping any one bit changes the noise
    assert len(key.secret) == KEY_BYTES == 32
    for bit in (0, 31, 32, 127, 128, 255):
        flipped = bytearray(key.secret)
        flipped[bit // 8] ^= 1 << (bit % 8)
        assert _residual(gaussian_noise(D, PrivacyKey(bytes(flipped))).row(3), target) > 1.5


def test_deployment_keys_come_from_the_os_and_are_never_written(tmp_path):
    from fedsim.config import load_config
    from fedsim.deploy.runconfig import Deployment
    from fedsim.runner import run_experiment

    assert PrivacyKey.generate() != PrivacyKey.generate()
    assert "privacy_key" in Deployment.__dataclass_fields__
    # a run's key never reaches its published files (here the simulation key, derived from the seed)
    cfg = load_config(
        None,
        [
            "rounds=2",
            "sampling.scheme='poisson'",
            "sampling.cohort_size=4",
            "privacy.mechanism='gaussian'",
            "privacy.noise_multiplier=1.0",
            "data.max_users=20",
            "client.max_examples=4",
            "eval.every=0",
            "eval.max_users=2",
            "eval.max_examples_per_user=2",
            "sim.num_workers=1",
            "sim.engine='inprocess'",
        ],
    )
    out = tmp_path / "run"
    run_experiment(cfg, out, progress=False)
    root = PrivacyKey.from_seed(cfg.seed)
    secrets_ = [k.secret for k in (root, root.derive("noise"), root.derive("sampling"), root.derive("clip-count"))]
    for f in ("config.toml", "ledger.json", "summary.json", "metrics.jsonl"):
        blob = (out / f).read_bytes()
        for sec in secrets_:
            assert sec not in blob and sec.hex().encode() not in blob
    # the checkpoint holds it, owner-only
    ck = out / "checkpoint" / "checkpoint.pt"
    assert (ck.stat().st_mode & 0o777) == 0o600 and (ck.parent.stat().st_mode & 0o777) == 0o700


def test_example_level_noise_cannot_be_regenerated_from_anything_public():
    """The old attack: regenerate the silo's DP-SGD noise from the config seed. With a clip so
    small that the update is noise alone, two trainings with everything public equal differ
    (each silo key is secret and fresh), and neither matches a torch generator seeded as before."""
    from torch.nn.utils import parameters_to_vector

    from fedsim.models import make_model
    from fedsim.training import example_dp
    from fedsim.training.example_dp import ExampleDP, local_delta_example_dp

    model = make_model("shakespeare_lstm_small", 80, seed=0, dp_layers=True)
    x0 = parameters_to_vector(model.parameters()).detach().clone()
    g = torch.Generator().manual_seed(0)
    X, Y = torch.randint(0, 80, (16, 10), generator=g), torch.randint(0, 80, (16,), generator=g)
    dp = ExampleDP(1.0, 1e-9)  # signal ≈ 0: Δ is −lr·σ·C·Σξ/B
    a, _, _ = local_delta_example_dp(model, x0, (X, Y), 3, 5, 0, 0.5, 8, 1, dp)
    saved = example_dp._SILO_KEY
    try:
        example_dp._SILO_KEY = None  # another silo process: a fresh OS key
        b, _, _ = local_delta_example_dp(model, x0, (X, Y), 3, 5, 0, 0.5, 8, 1, dp)
    finally:
        example_dp._SILO_KEY = saved
    assert _residual(b, a) > 1.5
    # the public seed stream the old code used does not explain the noise either
    for s in (derive_seed(0, "example-dp-noise", 3, 5), 0):
        cand = torch.randn(a.numel(), generator=torch.Generator().manual_seed(s))
        assert abs(float(np.corrcoef(cand.numpy(), a.numpy())[0, 1])) < 0.1
    # the silo key is not part of the task a worker receives (the task is all the server sends)
    from fedsim.config import load_config
    from fedsim.protocol import Task
    from fedsim.training.local import LocalTraining

    task = Task(
        load_config(None).data,
        "shakespeare_lstm_small",
        1,
        0,
        LocalTraining(1, 8, 0.5, 16, 1.0),
        example_dp=dp,
    ).to_json()
    assert example_dp.silo_key().secret.hex() not in task and "silo" not in task


@pytest.mark.parametrize("seed", [0, 2**32, 2**62])
def test_adaptive_clip_and_sampler_keys_keep_the_whole_seed(seed):
    from fedsim.privacy.adaptive_clip import AdaptiveClip

    a = AdaptiveClip(1.0, 0.5, 0.2, 1.0, 10, PrivacyKey.from_seed(seed)).count_noise(0)
    b = AdaptiveClip(1.0, 0.5, 0.2, 1.0, 10, PrivacyKey.from_seed(seed + 1)).count_noise(0)
    assert a != b
