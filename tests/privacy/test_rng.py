"""The keyed CSPRNG streams (fedsim.privacy.rng): distribution, reproducibility, key use."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from fedsim.privacy.rng import (
    KEY_BYTES,
    PrivacyKey,
    gaussians,
    keystream,
    prf_mod,
    prf_u64,
    prf_uniform,
    random_words,
    uniforms,
    user_tags,
)


def test_keystream_is_aes256_ctr_from_the_key():
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    key = PrivacyKey.from_seed(7)
    want = Cipher(algorithms.AES(key.secret), modes.CTR(bytes(16))).encryptor().update(bytes(100))
    assert keystream(key, 100) == want
    assert bytes(random_words(key, 12).numpy().tobytes()) == want[:96]
    assert len(key.secret) == KEY_BYTES == 32


def test_seeds_equal_in_their_low_32_bits_give_unrelated_keys_and_noise():
    # torch's CPU generator keeps only the low 32 bits of a seed; our keys keep the whole seed.
    a, b = PrivacyKey.from_seed(5), PrivacyKey.from_seed(5 + 2**32)
    assert a != b
    za, zb = gaussians(a.derive("noise", 0), 4096), gaussians(b.derive("noise", 0), 4096)
    assert abs(float(np.corrcoef(za.numpy(), zb.numpy())[0, 1])) < 0.1


def test_derive_separates_purposes_and_indices():
    k = PrivacyKey.from_seed(0)
    keys = {
        k.derive("noise", 0),
        k.derive("noise", 1),
        k.derive("sampling", 0),
        k.derive("noise", "0"),
        k.derive("noise0"),
        k,
    }
    assert len(keys) == 6
    assert k.derive("noise", 3) == PrivacyKey.from_seed(0).derive("noise", 3)
    assert "secret" not in repr(k) or "<secret>" in repr(k)
    assert k.secret.hex() not in repr(k)


def test_generate_draws_fresh_keys():
    assert len({PrivacyKey.generate().secret for _ in range(8)}) == 8


def test_uniforms_are_in_the_unit_interval_and_uniform():
    u = uniforms(PrivacyKey.from_seed(1), 200_000).numpy()
    assert u.dtype == np.float64 and u.min() >= 0.0 and u.max() < 1.0
    assert stats.kstest(u, "uniform").pvalue > 1e-3


@pytest.mark.parametrize("n", [1, 2, 3, 1001])
def test_gaussians_shape_dtype_and_reproducibility(n):
    k = PrivacyKey.from_seed(2).derive("noise", n)
    z = gaussians(k, n)
    assert z.shape == (n,) and z.dtype == torch.float32
    assert torch.equal(z, gaussians(k, n))
    z64 = gaussians(k, n, dtype=torch.float64)
    assert torch.equal(z64.to(torch.float32), z)  # float64 transform, cast at the end


def test_gaussians_are_standard_normal():
    z = gaussians(PrivacyKey.from_seed(3), 400_000, dtype=torch.float64).numpy()
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs(z.mean()) < 5 * 1 / np.sqrt(len(z))
    assert abs(z.var() - 1) < 5 * np.sqrt(2 / len(z))
    # the two Box–Muller halves are independent of each other
    h = len(z) // 2
    assert abs(np.corrcoef(z[:h], z[h:])[0, 1]) < 5 / np.sqrt(h)
    assert abs(np.corrcoef(z[:h] ** 2, z[h:] ** 2)[0, 1]) < 5 / np.sqrt(h)


def test_prf_value_of_a_tag_does_not_depend_on_the_other_tags():
    key = PrivacyKey.from_seed(4)
    tags = user_tags([f"user-{i}" for i in range(1000)])
    full = prf_u64(key, tags, 9)
    sub = prf_u64(key, tags[::7], 9)
    assert np.array_equal(full[::7], sub)
    assert not np.array_equal(prf_u64(key, tags, 10), full)
    g = prf_mod(key, tags, 0, 28)
    assert g.min() >= 0 and g.max() < 28
    assert stats.chisquare(np.bincount(g, minlength=28)).pvalue > 1e-3
    u = prf_uniform(key, tags, 1)
    assert u.min() >= 0 and u.max() < 1


def test_user_tags_are_stable_and_distinct():
    t = user_tags(["a", "b", "a", "ROMEO AND JULIET_ROMEO"])
    assert t[0] == t[2] and t[0] != t[1]
    assert user_tags(["a"])[0] == t[0]
