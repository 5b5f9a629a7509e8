"""Attacks by a registered noise mechanism (issue 44, part 2): fedsim checks C, M and the stream
itself before any ε, so a plugin cannot print an ε its noise does not give.

On the previous main a plugin with ``M = ½·C⁻¹`` printed ε = 0.281 through the Flower wrapper (6
rounds, z = 2), the correct plugin's value, while its noise had a quarter of the variance (true
ε = 1.150); ``M = 0`` and an upper-triangular ``C`` were accepted as well.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pytest
import torch

from fedsim.errors import FedsimError
from fedsim.privacy.mechanisms import MECHANISMS, MFOptions, check_independent_mechanism, plan_mf
from fedsim.privacy.mechanisms.base import DenseStrategy, Mechanism, Strategy
from fedsim.privacy.noise import MatrixStream, ZeroStream
from fedsim.privacy.participation import make_scheme
from fedsim.privacy.sensitivity import sensitivity
from fedsim.privacy.stream import NoiseStream

ROUNDS, B = 12, 4


def _two_tap(n: int) -> np.ndarray:
    return np.eye(n) + 0.5 * np.eye(n, k=-1)


class _Opts(MFOptions):
    mechanism: Literal["attack"] = "attack"


class _Attack(Mechanism):
    name = "attack"
    options = _Opts
    summary = "a test's mechanism"

    def __init__(self, make: Any, correlated: bool = True, stream: Any = None) -> None:
        self.make, self.correlated, self._stream = make, correlated, stream

    def strategy(self, opts, A, scheme):
        return self.make(A.shape[0])

    def independent_stream(self) -> NoiseStream:
        return self._stream()


@pytest.fixture
def register():
    def add(mech: Mechanism) -> None:
        dict.__setitem__(MECHANISMS, "attack", mech)  # as fedsim.register_mechanism would, after the freeze

    yield add
    MECHANISMS.pop("attack", None)


def _plan():
    scheme = make_scheme("epochs", 120, None, min_sep=B, max_participations=ROUNDS // B, rounds=ROUNDS)
    return plan_mf(_Opts(), scheme, ROUNDS), scheme


def test_the_honest_plugin_passes(register):
    register(_Attack(lambda n: DenseStrategy(_two_tap(n), np.linalg.inv(_two_tap(n)))))
    plan, scheme = _plan()
    want = sensitivity(_two_tap(ROUNDS), "epochs", k=ROUNDS // B, b=B)
    assert plan.sens == pytest.approx(want[0], rel=1e-12)


@pytest.mark.parametrize(
    ("make", "rule"),
    [
        (lambda n: DenseStrategy(_two_tap(n), 0.5 * np.linalg.inv(_two_tap(n))), "not a left inverse"),
        (lambda n: DenseStrategy(_two_tap(n), np.zeros((n, n))), "not a left inverse"),
        (lambda n: DenseStrategy(_two_tap(n).T.copy(), np.linalg.inv(_two_tap(n).T)), "not lower-triangular"),
        (lambda n: DenseStrategy(np.tril(np.ones((n, n))) - np.eye(n), np.eye(n)), "zero on the diagonal"),
        (lambda n: DenseStrategy(_two_tap(n)[:, :-1], np.eye(n - 1, n)), "covers 11 rounds"),
        (lambda n: DenseStrategy(_two_tap(n)[:-1], np.eye(n, n - 1)), "shape"),
        (lambda n: DenseStrategy(_two_tap(n) * np.nan, np.eye(n)), "not finite"),
    ],
    ids=["half_inverse", "zero_M", "upper_C", "singular_C", "short_C", "wide_C", "nan_C"],
)
def test_a_bad_matrix_is_refused_before_any_epsilon(register, make, rule):
    register(_Attack(make))
    with pytest.raises(FedsimError, match=rule):
        _plan()


def test_a_non_causal_left_inverse_is_refused(register):
    """``C = [I; L]`` (m = 2n): ``M = [I − a·L⁻¹·…]``-style inverses exist that are exact left
    inverses but use in round t rows of Z that depend on later rounds."""

    def make(n):
        C = np.vstack([np.eye(n), np.tril(np.ones((n, n)))])
        M = np.hstack([np.eye(n), np.zeros((n, n))])
        # add a null-space direction of C that reaches into a late row: x·C = 0 with x ≠ 0
        x = np.zeros(2 * n)
        x[n - 1] = 1.0  # row n−1 of I (ends at round n−1)
        x[n + n - 1] = -1.0 + 0.0  # minus the last prefix row ... plus the one before it
        x[n + n - 2] = 1.0
        assert np.allclose(x @ C, 0.0)
        M = M.copy()
        M[0] += x  # round 0's noise now uses rows that end at round n−1
        return DenseStrategy(C, M)

    register(_Attack(make))
    with pytest.raises(FedsimError, match="not causal"):
        _plan()


@dataclass(frozen=True, eq=False)
class _LowSens(Strategy):
    """A plugin strategy that claims a smaller sensitivity than its C has."""

    C: np.ndarray
    info: dict = field(default_factory=dict)

    @property
    def rounds(self) -> int:
        return int(self.C.shape[0])

    def materialize(self) -> np.ndarray:
        return self.C

    def sensitivity(self, scheme):
        return 0.1, True


def test_a_plugins_sensitivity_is_computed_by_fedsim(register):
    register(_Attack(lambda n: _LowSens(_two_tap(n))))
    plan, _ = _plan()
    assert plan.sens == pytest.approx(sensitivity(_two_tap(ROUNDS), "epochs", k=ROUNDS // B, b=B)[0], rel=1e-12)
    assert plan.sens > 1.0


class _HalfStream(MatrixStream):
    def step(self, t, draw):
        return 0.5 * super().step(t, draw)


class _LateHalfStream(MatrixStream):
    """Honest for the first rounds, then half the noise: caught while the probe covers them."""

    def step(self, t, draw):
        return (0.5 if t >= 5 else 1.0) * super().step(t, draw)


@dataclass(frozen=True, eq=False)
class _StreamOf(DenseStrategy):
    kind: Any = None

    def stream(self, sens, name):
        return self.kind(self.M, sens, name=name)


@pytest.mark.parametrize("kind", [_HalfStream, _LateHalfStream], ids=["half", "half_after_5"])
def test_a_stream_that_is_not_its_matrix_is_refused(register, kind):
    C = _two_tap(ROUNDS)
    register(_Attack(lambda n: _StreamOf(C, np.linalg.inv(C), {}, kind)))
    with pytest.raises(FedsimError, match="not row"):
        _plan()


class _WrongSensStream(MatrixStream):
    def __init__(self, M, sens, name="x"):
        super().__init__(M, sens / 2, name)


def test_a_stream_with_another_sensitivity_is_refused(register):
    C = _two_tap(ROUNDS)
    register(_Attack(lambda n: _StreamOf(C, np.linalg.inv(C), {}, _WrongSensStream)))
    with pytest.raises(FedsimError, match="sensitivity"):
        _plan()


class _HalfGaussian(NoiseStream):
    def step(self, t, draw):
        return 0.5 * draw(t)


@pytest.mark.parametrize("stream", [ZeroStream, _HalfGaussian], ids=["zero", "half"])
def test_an_independent_plugin_must_add_xi(register, stream):
    register(_Attack(None, correlated=False, stream=stream))
    with pytest.raises(FedsimError, match="ξ_t"):
        check_independent_mechanism("attack")


def test_every_shipped_mechanism_passes():
    """The checks refuse no mechanism fedsim ships, under every scheme it runs them with."""
    for name, mech in MECHANISMS.items():
        if not mech.correlated:
            check_independent_mechanism(name)
            continue
        for scheme_name in ("single", "epochs", "min_sep"):
            n, b = 16, 4
            if scheme_name == "single":
                scheme = make_scheme("single", 256, 16, rounds=n)
            else:
                scheme = make_scheme(scheme_name, 64, None, min_sep=b, max_participations=n // b, rounds=n)
            opts = {"bands": b} if name == "banded" else {}
            try:
                plan = plan_mf(name, scheme, n, **opts)
            except FedsimError as e:
                assert "refused" not in str(e), (name, scheme_name, e)
                continue
            assert plan.sens > 0


def test_the_flower_wrapper_refuses_a_half_noise_plugin(tmp_path):
    """Through the door the issue's attack used: `fedsim.flower.UserLevelDP` with a registered
    mechanism whose M is ½·C⁻¹ raises before round 1, and prints no ε."""
    script = textwrap.dedent(
        """
        import json, numpy as np, fedsim
        from typing import Literal
        from fedsim.privacy.mechanisms.base import DenseStrategy, Mechanism, MFOptions

        class HalfOptions(MFOptions):
            mechanism: Literal["half"] = "half"

        class Half(Mechanism):
            name, options, summary = "half", HalfOptions, "half the noise"
            def strategy(self, opts, A, scheme):
                C = np.eye(A.shape[0]) + 0.5 * np.eye(A.shape[0], k=-1)
                return DenseStrategy(C, 0.5 * np.linalg.inv(C))

        fedsim.register_mechanism("half", Half(), HalfOptions)
        from flwr.serverapp.strategy import FedAvg
        from fedsim.errors import FedsimError
        from fedsim.flower import UserLevelDP
        try:
            UserLevelDP(FedAvg(), population=100, rounds=6, clip_norm=1.0,
                        privacy={"mechanism": "half", "noise_multiplier": 2.0},
                        sampling={"scheme": "epochs", "min_sep": 3})
            print(json.dumps({"refused": False}))
        except FedsimError as e:
            print(json.dumps({"refused": True, "message": str(e)}))
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["refused"] and "not a left inverse" in got["message"], got


def test_registered_stages_see_only_noised_updates():
    """A filter and a server optimizer (the stages a plugin can register) are handed
    ``(U_t + c·z·sens·n_t)/K̄``, never the sum ``U_t``: recomputed here from an independent
    draw of the same noise row."""
    from fedsim.privacy.accounting import AccountingSpec
    from fedsim.privacy.ledger import Ledger
    from fedsim.privacy.noise import gaussian_noise
    from fedsim.server.filters.base import Filter
    from fedsim.server.optim import SGD
    from fedsim.server.step import DPServer

    seen: dict[str, list[torch.Tensor]] = {"filter": [], "optimizer": []}

    class Spy(Filter):
        def step(self, update):
            seen["filter"].append(update.clone())
            self.t += 1
            return update.clone()

        def impulse_response(self, n):
            return np.eye(n)

        def state_dict(self):
            return {"t": self.t}

        def load_state_dict(self, state):
            self.t = state["t"]

    class SpySGD(SGD):
        def step(self, params, grad, raw=None):
            seen["optimizer"].append(grad.clone())
            super().step(params, grad, raw)

    d, c, z, kbar = 50, 1.0, 3.0, 10.0
    spec = AccountingSpec("gaussian", "poisson", 1000, kbar, z, 1e-5)
    server = DPServer(torch.zeros(d), gaussian_noise(d, 11), SpySGD(0.1), Ledger(spec, 3), c, z, kbar, filter=Spy())
    twin = gaussian_noise(d, 11)  # the same key: the same rows, drawn independently
    for t in range(3):
        total = torch.full((d,), float(t + 1))
        server.step(total, 10)
        want = (total + c * z * twin.row(t)) / kbar
        assert torch.allclose(seen["filter"][t], want, atol=1e-6)
        assert torch.allclose(seen["optimizer"][t], -want, atol=1e-6)
        assert not torch.allclose(seen["filter"][t], total / kbar, atol=1e-3)
