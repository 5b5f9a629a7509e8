"""Flat L2 clipping and the streaming noise mechanisms (docs/algorithms.md sections 1 and 3)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsim.errors import FedsimError
from fedsim.privacy.clipping import NORM_BLOCK, clip_rows, clip_vector, l2_norm
from fedsim.privacy.noise import gaussian_noise, zero_noise


def norm64(v: torch.Tensor) -> float:
    """Independent float64 L2 norm (numpy, not the module's helper)."""
    return float(np.linalg.norm(v.detach().cpu().to(torch.float64).numpy()))


def random_cases(n: int, seed: int = 0):
    """(vector, clip) pairs spanning many scales; norms from 1e-30 to 1e12."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        d = int(rng.integers(1, 5000))
        direction = rng.standard_normal(d)
        if rng.random() < 0.2:  # spiky / sparse directions too
            direction *= rng.random(d) < 0.05
            if not direction.any():
                direction[0] = 1.0
        direction /= np.linalg.norm(direction)
        target_norm = 10.0 ** rng.uniform(-30, 12)
        c = 10.0 ** rng.uniform(-6, 6)
        yield torch.from_numpy(direction * target_norm), c


# --- clipping ------------------------------------------------------------------------


def test_l2_norm_is_float64_exact():
    v = torch.tensor([3.0, 4.0], dtype=torch.float32)
    assert l2_norm(v) == 5.0
    big = torch.full((10,), 1e30, dtype=torch.float32)  # float32 sum of squares would overflow
    assert math.isfinite(l2_norm(big))
    assert l2_norm(big) == pytest.approx(norm64(big), rel=1e-12)


@pytest.mark.parametrize("extra", [-1, 0, 1, 12345])
def test_l2_norm_in_blocks_equals_the_float64_norm_across_block_boundaries(extra):
    from fedsim.privacy.clipping import NORM_BLOCK

    g = torch.Generator().manual_seed(extra + 7)
    for n in (NORM_BLOCK + extra, 3 * NORM_BLOCK + extra):
        v = torch.randn(n, generator=g) * 1e30  # float32 squares would overflow a float32 sum
        assert l2_norm(v) == pytest.approx(norm64(v), rel=1e-12)
        # a view that is not contiguous is read the same way
        assert l2_norm(v.view(-1, 1).expand(-1, 2)[:, 1]) == pytest.approx(norm64(v), rel=1e-12)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_l2_norm_in_blocks_is_not_finite_exactly_when_an_entry_is_not(bad):
    from fedsim.privacy.clipping import NORM_BLOCK

    n = 3 * NORM_BLOCK + 5
    for where in (0, NORM_BLOCK - 1, NORM_BLOCK, 2 * NORM_BLOCK + 17, n - 1):  # every block, both ends
        v = torch.ones(n)
        v[where] = bad
        assert not math.isfinite(l2_norm(v)), where
        clipped, norm = clip_vector(v, 1.0)
        assert norm == math.inf and not clipped.any()
    assert math.isfinite(l2_norm(torch.full((n,), 3.0e38)))  # the largest float32 squares still sum finitely


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_clip_never_exceeds_bound_and_keeps_direction(dtype):
    n_clipped = n_kept = 0
    for v64, c in random_cases(400, seed=1 if dtype == torch.float32 else 2):
        v = v64.to(dtype)
        if not torch.isfinite(v).all() or norm64(v) == 0.0:
            continue
        before = v.clone()
        out, reported = clip_vector(v, c)
        assert out.dtype == dtype and out.shape == v.shape
        assert torch.equal(v, before)  # input not modified
        nv = norm64(v)
        assert reported == pytest.approx(nv, rel=1e-12)
        nout = norm64(out)
        assert nout <= c, (nout, c, nv)
        if nv < c * (1 - 1e-12):
            n_kept += 1
            assert torch.equal(out, v)
        elif nv > c * (1 + 1e-12):
            n_clipped += 1
            # clipped to (almost exactly) the bound, not far below it
            assert nout >= c * (1 - 1e-5)
            cos = float(np.dot(out.to(torch.float64).numpy(), v.to(torch.float64).numpy())) / (nout * nv)
            assert cos == pytest.approx(1.0, abs=1e-6)
    assert n_clipped > 50 and n_kept > 50  # both branches exercised


@pytest.mark.parametrize("scale", [1e6, 1e-6, 1.0])
def test_clip_float32_exact_boundary_cases(scale):
    # norms straddling c by one ulp, and vectors whose float32 rounding pushes the
    # product up: the certified float64 norm must still be <= c
    g = torch.Generator().manual_seed(7)
    for d in (1, 2, 3, 17, 1000, 100_000):
        v = torch.randn(d, generator=g, dtype=torch.float32)
        c = float(norm64(v)) * scale
        v = v * scale
        for factor in (1.0, 1.0 + 2**-23, 1.0 + 1e-6, 1.5, 1e3):
            w = (v.to(torch.float64) * factor).to(torch.float32)
            out, _ = clip_vector(w, c)
            assert norm64(out) <= c
            # (within an ulp of c the two float64 norm algorithms may disagree on the branch)
            if norm64(w) < c * (1 - 1e-12):
                assert torch.equal(out, w)


def test_clip_known_values():
    v = torch.tensor([3.0, 4.0], dtype=torch.float64)  # norm 5
    out, n = clip_vector(v, 1.0)
    assert n == 5.0
    assert torch.allclose(out, torch.tensor([0.6, 0.8], dtype=torch.float64), rtol=1e-6, atol=0)
    out2, _ = clip_vector(v, 5.0)
    assert torch.equal(out2, v)
    out3, _ = clip_vector(v, 10.0)
    assert torch.equal(out3, v)
    z = torch.zeros(4)
    out4, n4 = clip_vector(z, 1.0)
    assert n4 == 0.0 and torch.equal(out4, z)


@pytest.mark.parametrize("c", [0.0, -1.0])
def test_clip_rejects_nonpositive_bound(c):
    with pytest.raises(ValueError):
        clip_vector(torch.ones(3), c)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_clip_half_precision_never_exceeds_bound(dtype):
    g = torch.Generator().manual_seed(3)
    for _ in range(50):
        v = torch.randn(257, generator=g, dtype=torch.float64) * 3
        out, _ = clip_vector(v.to(dtype), 1.0)
        assert norm64(out) <= 1.0


# --- noise ---------------------------------------------------------------------------

DIM = 200_000


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("d", [1, 7, 650, NORM_BLOCK // 3, NORM_BLOCK + 3])
def test_clip_rows_is_clip_vector_on_every_row(dtype, d):
    """Vectorized training clips all its users' deltas at once: every row must be exactly what
    :func:`clip_vector` gives it alone (same norm, same bits), whatever the other rows hold —
    tiny, huge, zero, NaN or infinite — and never above the bound."""
    g = torch.Generator().manual_seed(d)
    scales = [1e-30, 0.5, 1.0, 3.0, 1e6, 0.0]
    rows = torch.stack([torch.randn(d, generator=g, dtype=torch.float64) * s for s in scales]).to(dtype)
    rows[1] *= 1.0 / norm64(rows[1])  # exactly at the bound (up to rounding)
    nan_row, inf_row = rows[0].clone(), rows[0].clone()
    nan_row[d // 2], inf_row[-1] = float("nan"), float("-inf")
    rows = torch.cat([rows, nan_row[None], inf_row[None]])
    for c in (1.0, 2.5e-3):
        out, norms = clip_rows(rows, c)
        assert out.dtype == dtype and out.shape == rows.shape
        for i in range(len(rows)):
            alone, norm = clip_vector(rows[i], c)
            assert torch.equal(out[i], alone), (i, c)
            assert norms[i] == norm
            if dtype != torch.float64 or d < 5000:  # (the bound clip_vector certifies: float64
                # rows of 10⁵ entries and more are within a few ulps of c, never used so — every
                # update is summed and sent as float32)
                assert norm64(out[i]) <= c
        assert norms[-1] == norms[-2] == math.inf and not out[-2:].any()


def test_clip_rows_rejects_nonpositive_bound():
    with pytest.raises(ValueError, match="clip_norm"):
        clip_rows(torch.ones(2, 3), 0.0)


def test_gaussian_row_is_deterministic_and_pure():
    a = gaussian_noise(1000, seed=5)
    b = gaussian_noise(1000, seed=5)
    r3 = a.row(3)
    assert r3.dtype == torch.float32 and r3.shape == (1000,)
    # pure function of (seed, t): independent of rows drawn before, and of the instance
    for t in (9, 0, 3, 1):
        b.row(t)
    assert torch.equal(b.row(3), r3)
    assert torch.equal(a.row(3), r3)


def test_gaussian_rows_differ_across_rounds_and_seeds():
    a = gaussian_noise(1000, seed=5)
    rows = [a.row(t) for t in range(5)]
    other = gaussian_noise(1000, seed=6).row(0)
    for i in range(5):
        assert not torch.equal(rows[i], other)
        for j in range(i + 1, 5):
            assert not torch.equal(rows[i], rows[j])


def test_gaussian_row_moments():
    # mean of d iid N(0,1): SE 1/sqrt(d); sample variance: SE sqrt(2/d). Tolerance 5 SE.
    se_mean, se_var = 1 / math.sqrt(DIM), math.sqrt(2 / DIM)
    noise = gaussian_noise(DIM, seed=11)
    for t in (0, 1, 57):
        x = noise.row(t).to(torch.float64)
        assert abs(float(x.mean())) < 5 * se_mean
        assert abs(float(x.var()) - 1.0) < 5 * se_var
        # Gaussian 4th moment (3), loose: SE of mean(x^4) is sqrt(96/d)
        assert abs(float((x**4).mean()) - 3.0) < 5 * math.sqrt(96 / DIM)
    # rows of different rounds / seeds are uncorrelated: |corr| < 5/sqrt(d)
    r0 = noise.row(0).to(torch.float64)
    r1 = noise.row(1).to(torch.float64)
    r0b = gaussian_noise(DIM, seed=12).row(0).to(torch.float64)
    for other in (r1, r0b):
        corr = float(torch.corrcoef(torch.stack([r0, other]))[0, 1])
        assert abs(corr) < 5 / math.sqrt(DIM)


def test_gaussian_row_variance_and_sensitivity():
    n = gaussian_noise(10, seed=0)
    assert n.sensitivity == 1.0
    assert n.row_variance(0) == 1.0 and n.row_variance(123) == 1.0


def test_zero_noise():
    z = zero_noise(37, seed=1)
    for t in (0, 5):
        r = z.row(t)
        assert r.shape == (37,) and r.dtype == torch.float32
        assert torch.count_nonzero(r) == 0
    assert z.row_variance(0) == 0.0


def test_noise_state_round_trip():
    a = gaussian_noise(500, seed=42)
    state = a.state_dict()
    b = gaussian_noise(500, seed=0)
    assert not torch.equal(b.row(4), a.row(4))
    b.load_state_dict(state)
    for t in (0, 4, 99):
        assert torch.equal(b.row(t), a.row(t))
    assert b.state_dict() == state


@pytest.mark.parametrize(
    "target, state",
    [
        (gaussian_noise(500, seed=0), gaussian_noise(501, seed=0).state_dict()),  # dim
        (gaussian_noise(500, seed=0), zero_noise(500, seed=0).state_dict()),  # mechanism
        (zero_noise(500, seed=0), gaussian_noise(500, seed=0).state_dict()),
        (gaussian_noise(500, seed=0), {"seed": 1}),  # incomplete
    ],
)
def test_noise_load_mismatched_state_raises(target, state):
    with pytest.raises(FedsimError):
        target.load_state_dict(state)


def test_make_noise_from_the_registry():
    from fedsim.privacy.mechanisms import make_noise

    g = make_noise("gaussian", 8, 1, "cpu")
    assert g.name == "gaussian" and g.sensitivity == 1.0
    assert torch.equal(g.row(2), gaussian_noise(8, 1).row(2))
    assert torch.equal(make_noise("none", 8, 1, "cpu").row(0), torch.zeros(8))
    with pytest.raises(FedsimError, match="laplace"):
        make_noise("laplace", 8, 1, "cpu")
    with pytest.raises(FedsimError, match="factorization plan"):
        make_noise("blt", 8, 1, "cpu")
