"""The noise table of dense, DP-MF+, tree and sqrt noise (issue 46): past the memory budget every
row of M·Z is computed once, by blocks of coordinates, instead of drawing ξ_0 … ξ_t again each
round. Rows must be the same numbers (the same ξ_j and M, summed in another order), with the
covariance M·Mᵀ; the table is as secret as the key, so it lives only in the folder it is given
(owner-only) and is deleted when the stream is closed or re-keyed."""

from __future__ import annotations

import stat

import numpy as np
import pytest
import torch

from fedsim.privacy.noise import TABLE_PREFIX, MatrixStream, NoiseMechanism

from .test_mf_core import dense_reference, random_banded


def _table_noise(M, d, seed, folder, budget):
    stream = MatrixStream(M, 1.0, name="dense", memory_budget=budget)
    noise = NoiseMechanism(d, seed, "cpu", stream)
    noise.set_scratch(folder)
    assert not stream.history_fits()
    return noise


@pytest.mark.parametrize("shape", ["square", "tree-like"])
def test_table_rows_are_m_times_z_to_the_last_float32_bit(tmp_path, shape):
    n, d = 9, 301
    M = np.linalg.inv(random_banded(n, n, seed=3))
    if shape == "tree-like":  # n × m with m > n, as the tree's A⁻¹B
        M = np.hstack([M, np.random.default_rng(1).normal(size=(n, 4))])
    ref = dense_reference(M, 7, d)
    budget = 8 * (M.shape[0] + M.shape[1]) * 64  # blocks of 64 coordinates: 5 blocks, the last ragged
    noise = _table_noise(M, d, 7, tmp_path, budget)
    assert noise.stream.table_block() == 64
    order = [4, 0, 8, 3]  # any order
    got = {t: noise.row(t).numpy() for t in order}
    plain = NoiseMechanism(d, 7, "cpu", MatrixStream(M, 1.0, memory_budget=0))  # redraws every row
    for t in order:
        want32 = plain.row(t).numpy()
        np.testing.assert_array_max_ulp(got[t], want32, maxulp=1)
        np.testing.assert_allclose(got[t], ref[t], rtol=1e-6, atol=1e-6)
        assert (got[t] == want32).mean() > 0.95  # nearly every coordinate bit for bit


def test_table_noise_covariance_is_m_mt(tmp_path):
    """Coordinates are i.i.d. draws of the n-vector of rows; their empirical covariance over
    d = 40,000 coordinates must match C⁻¹C⁻ᵀ (entrywise within 5 standard errors)."""
    n, d = 6, 40_000
    Cinv = np.linalg.inv(random_banded(n, n, seed=5))
    target = Cinv @ Cinv.T
    noise = _table_noise(Cinv, d, 3, tmp_path, 8 * 2 * n * 4096)
    rows = np.stack([noise.row(t).double().numpy() for t in range(n)])
    emp = rows @ rows.T / d
    se = np.sqrt((np.outer(np.diag(target), np.diag(target)) + target**2) / d)
    assert np.all(np.abs(emp - target) <= 5 * se)


def test_the_table_is_owner_only_in_its_folder_and_deleted_on_close(tmp_path):
    M = np.linalg.inv(random_banded(5, 5, seed=2))
    folder = tmp_path / "checkpoint"
    noise = _table_noise(M, 50, 1, folder, 64)
    first = noise.row(0).clone()
    tables = list(folder.glob(TABLE_PREFIX + "*"))
    assert len(tables) == 1 and [p for p in tmp_path.rglob("*") if p.is_file()] == tables
    assert stat.S_IMODE(tables[0].stat().st_mode) == 0o600 and stat.S_IMODE(folder.stat().st_mode) == 0o700
    noise.close()
    assert not tables[0].exists()
    # rebuilt on demand: the same rows, bit for bit (a resume rebuilds it)
    assert torch.equal(noise.row(0), first)
    # a new key (a checkpoint loaded) drops the old key's table
    state = noise.state_dict()
    noise.load_state_dict(state)
    assert not list(folder.glob(TABLE_PREFIX + "*"))
    noise.close()


def test_a_killed_runs_table_is_removed_by_the_next(tmp_path):
    M = np.linalg.inv(random_banded(4, 4, seed=4))
    stale = tmp_path / f"{TABLE_PREFIX}killed"
    stale.write_bytes(b"x")
    noise = _table_noise(M, 20, 1, tmp_path, 32)
    noise.row(0)
    assert not stale.exists() and len(list(tmp_path.glob(TABLE_PREFIX + "*"))) == 1
    noise.close()


def test_without_a_folder_no_table_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    M = np.linalg.inv(random_banded(4, 4, seed=4))
    noise = NoiseMechanism(20, 1, "cpu", MatrixStream(M, 1.0, memory_budget=32))
    noise.row(3)
    assert not list(tmp_path.rglob("*"))


def test_a_table_that_does_not_fit_on_disk_is_refused_before_any_round(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from fedsim.errors import FedsimError

    M = np.linalg.inv(random_banded(8, 8, seed=4))
    noise = NoiseMechanism(1000, 1, "cpu", MatrixStream(M, 1.0, name="dense", memory_budget=64))
    assert noise.stream.table_bytes() == 8 * 1000 * 4
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 31_999, 31_999))
    with pytest.raises(FedsimError, match="needs 0.0 GB .*'blt' or 'banded'.*noise_table = false"):
        noise.set_scratch(tmp_path / "checkpoint")  # not made yet: its parent's disk is asked
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 32_000, 32_000))
    noise.set_scratch(tmp_path / "checkpoint")
    assert not list(tmp_path.rglob("*"))  # nothing written before a row is asked for


def test_the_header_states_the_tables_cost():
    from fedsim.runner.build import noise_table_note

    M = np.linalg.inv(random_banded(100, 100, seed=4))
    noise = NoiseMechanism(50_000, 1, "cpu", MatrixStream(M, 1.0, name="dense", memory_budget=1 << 20))
    note = noise_table_note(noise.stream)
    assert "Z's 100 rows of 50,000 (0.0 GiB)" in note and "a 0.0 GB table in the run's checkpoint/" in note
    noise = NoiseMechanism(4_050_748, 1, "cpu", MatrixStream(np.eye(2048), 1.0, name="dense"))
    assert "a 33.2 GB table" in noise_table_note(noise.stream)


def test_once_the_table_is_built_nothing_is_drawn_ahead(tmp_path):
    M = np.linalg.inv(random_banded(6, 6, seed=6))
    noise = _table_noise(M, 40, 2, tmp_path, 64)
    noise.prefetch(0)  # before the table: ξ_0 is drawn ahead, and the build takes it
    assert noise._ahead is not None
    noise.row(0)
    assert noise._ahead is None
    noise.prefetch(1)  # the table holds every row: no Gaussian is drawn for round 1
    assert noise._ahead is None and torch.equal(noise.row(1), noise.row(1))
    noise.close()
