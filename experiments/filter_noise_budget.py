"""Why the filter ablation found nothing: the noise budget of its runs, measured (issue 38).

Three measurements, each for a claim in experiments/README.md's "Filter ablation" section:

1. ``--runs``: the per-round norms inside ``ĝ_t = (U_t + c·z·sens·n_t)/K̄`` of the ablation's own
   configuration (the sweep ``experiments/sweeps/filter_ablation.toml``, no filter, server lr 1.0,
   seed 0, Gaussian and BLT arms): the signal ``‖U_t‖/K̄`` against the noise ``‖c·z·sens·n_t‖/K̄``,
   and the same for their sums over the run (what server SGD adds into the iterate). The server's
   ``noisy_mean`` is wrapped to record them; the run is otherwise the sweep's trial. With
   ``--lrs`` the Gaussian no-filter arm also runs at the given server steps (final accuracy).
2. Always: the variance of the summed filtered noise ``Σ_t m̂_t`` over ``T`` rounds relative to the
   unfiltered ``Σ_t ĝ_t`` (white noise and the ablation's BLT noise), for EMA κ = 0.7 (DiSK's server
   side), DOPPLER ``first_order_v1`` and ``second_order``. Computed three ways: from the filter's
   impulse response with its start-up normalisation (``w = 1ᵀH``, ratio ``‖wᵀM‖²/‖1ᵀM‖²`` with
   ``M = C⁻¹`` the noise's rows); by pushing simulated noise through the filter objects; and, for
   DOPPLER, without the normalisation (plain ``lfilter``), where unit DC gain leaves only a boundary
   term and the ratio is below 1.
3. ``--shared``: that the arms of one seed share the initial model, every round's cohort and every
   round's noise (built with ``fedsim.runner.build.build_run``, nothing trained), which is why one
   seed can stall in every arm.

Run: ``python experiments/filter_noise_budget.py [--runs] [--shared] [--lrs 0.5,1.5] [--json FILE]``
(experiments/README.md, "The noise budget, measured").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.signal import lfilter

HERE = Path(__file__).resolve().parent
SWEEP = HERE / "sweeps" / "filter_ablation.toml"

#: The filters whose noise the ablation's arms run through (DiSK's server recursion is the EMA).
FILTERS: dict[str, dict[str, Any]] = {
    "ema": {"name": "ema", "kappa": 0.7},
    "doppler_v1": {"name": "doppler", "preset": "first_order_v1"},
    "doppler_2nd": {"name": "doppler", "preset": "second_order"},
}


def arm_config(arm: str, seed: int, lr: float = 1.0) -> Any:
    """The config of the sweep's trial ``arm``, server lr ``lr``, seed ``seed`` (as the sweep builds it)."""
    from fedsim.runner.sweep import load_spec, read_base, trial_config

    spec, base = load_spec(SWEEP)
    sets = next(a.set for a in spec.arms if a.name == arm)
    return trial_config(read_base(base), [*spec.set, *sets, f"server.lr={lr!r}", f"seed={seed}"])


def blt_noise_rows(rounds: int) -> tuple[np.ndarray, float]:
    """``M = C⁻¹`` (``n_t = (M·Z)_t``) and ``sens(C)`` of the BLT arms' plan."""
    from fedsim.runner.build import prepare

    prep = prepare(arm_config("blt+none", 0))
    assert prep.plan is not None and prep.plan.noising.shape == (rounds, rounds)
    return np.asarray(prep.plan.noising, dtype=np.float64), float(prep.plan.sens)


def make(name: str) -> Any:
    from fedsim.server.filters import make_filter

    opts = dict(FILTERS[name])
    return make_filter(opts.pop("name"), **opts)


def ratio_impulse(name: str, m: np.ndarray) -> float:
    """``Var(Σ_t m̂_t) / Var(Σ_t ĝ_t)`` per coordinate from the impulse response ``H`` (start-up
    normalisation included): ``Σ_t m̂_t = wᵀ·M·Z`` with ``w = 1ᵀH``."""
    h = make(name).impulse_response(m.shape[0])
    w = h.sum(axis=0)
    ones = np.ones(m.shape[0])
    return float(np.sum((w @ m) ** 2) / np.sum((ones @ m) ** 2))


def ratio_unnormalised(name: str, m: np.ndarray) -> float | None:
    """The same ratio for DOPPLER's plain IIR filter, without the step-response division (None for EMA)."""
    f = make(name)
    if not hasattr(f, "b"):
        return None
    k = lfilter(np.array(f.b), np.array((1.0, *f.a)), np.eye(1, m.shape[0], 0).ravel())
    w = np.cumsum(k)[::-1]  # w_s = Σ_{j < T−s} k_j: input s reaches T−s outputs
    ones = np.ones(m.shape[0])
    return float(np.sum((w @ m) ** 2) / np.sum((ones @ m) ** 2))


def ratio_simulated(name: str, m: np.ndarray, reps: int, seed: int = 0) -> tuple[float, float]:
    """The ratio from ``reps`` simulated noise streams pushed through the filter object, with the
    standard error of the variance ratio (delta method, per coordinate independent)."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((m.shape[0], reps))
    noise = m @ z  # (T, reps): row t is n_t for `reps` independent coordinates
    f = make(name)
    filtered = np.zeros(reps)
    for t in range(m.shape[0]):
        filtered += f.step(torch.from_numpy(noise[t])).numpy()
    raw = noise.sum(axis=0)
    r = float(np.var(filtered) / np.var(raw))
    cov = np.cov(filtered**2, raw**2)
    mf, mr = np.mean(filtered**2), np.mean(raw**2)
    var_r = (cov[0, 0] / mr**2 - 2 * mf * cov[0, 1] / mr**3 + mf**2 * cov[1, 1] / mr**4) / reps
    return r, float(math.sqrt(max(var_r, 0.0)))


def startup_table(rounds: int, reps: int) -> dict[str, Any]:
    """Summed-noise variance ratios for every filter under white and BLT noise."""
    m_blt, sens = blt_noise_rows(rounds)
    out: dict[str, Any] = {"T": rounds, "blt_sens": sens, "rows": {}}
    for noise, m in (("white", np.eye(rounds)), ("blt", m_blt)):
        for name in FILTERS:
            sim, se = ratio_simulated(name, m, reps)
            out["rows"][f"{name}/{noise}"] = {
                "impulse": ratio_impulse(name, m),
                "simulated": sim,
                "simulated_se": se,
                "unnormalised": ratio_unnormalised(name, m),
            }
    return out


class _Recorder:
    """Wraps ``DPServer.noisy_mean`` to record the signal and noise parts of ``ĝ_t``."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self.sum_signal: torch.Tensor | None = None
        self.sum_noise: torch.Tensor | None = None

    def install(self) -> Any:
        from fedsim.server.step import DPServer

        original = DPServer.noisy_mean
        rec = self

        def noisy_mean(server: Any, total: torch.Tensor, t: int) -> torch.Tensor:
            g = original(server, total, t)
            signal = total.to(g.device, torch.float32) / server.expected_cohort
            noise = g - signal
            rec.add(signal.double(), noise.double())
            return g

        setattr(DPServer, "noisy_mean", noisy_mean)  # noqa: B010 (restored by measured_run)
        return original

    def add(self, signal: torch.Tensor, noise: torch.Tensor) -> None:
        self.rows.append({"signal": float(signal.norm()), "noise": float(noise.norm())})
        self.sum_signal = signal.clone() if self.sum_signal is None else self.sum_signal + signal
        self.sum_noise = noise.clone() if self.sum_noise is None else self.sum_noise + noise


def measured_run(arm: str, lr: float, seed: int = 0) -> dict[str, Any]:
    """Train the sweep's trial once, recording the norms; returns them and the final accuracy."""
    from fedsim.runner import run_experiment
    from fedsim.server.step import DPServer

    cfg = arm_config(arm, seed, lr)
    rec = _Recorder()
    original = rec.install()
    start = time.time()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            summary = run_experiment(cfg, Path(tmp) / "run", progress=False)
    finally:
        setattr(DPServer, "noisy_mean", original)  # noqa: B010
    sig = np.array([r["signal"] for r in rec.rows])
    noi = np.array([r["noise"] for r in rec.rows])
    assert rec.sum_signal is not None and rec.sum_noise is not None
    return {
        "arm": arm,
        "lr": lr,
        "seed": seed,
        "rounds": len(rec.rows),
        "seconds": round(time.time() - start, 1),
        "final_eval_accuracy": summary.get("final_eval_accuracy"),
        "signal_mean": float(sig.mean()),
        "signal_max": float(sig.max()),
        "noise_mean": float(noi.mean()),
        "noise_min": float(noi.min()),
        "noise_max": float(noi.max()),
        "sum_signal_norm": float(rec.sum_signal.norm()),
        "sum_noise_norm": float(rec.sum_noise.norm()),
    }


def _digest(arrays: list[Any]) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(np.asarray(a)).tobytes())
    return h.hexdigest()[:16]


def shared_randomness(seed: int, arms: list[str], rounds: int) -> dict[str, dict[str, str]]:
    """Per arm of one seed: digests of the initial model, the cohorts and the noise rows."""
    from fedsim.runner.build import build_run

    out = {}
    for arm in arms:
        run = build_run(arm_config(arm, seed))
        cohorts = [np.array(run.sampler.sample(t), dtype=np.int64) for t in range(rounds)]
        noise = [run.noise.row(t).cpu().numpy() for t in range(rounds)]
        out[arm] = {
            "x0": _digest([run.prep.x0.numpy()]),
            "cohorts": _digest(cohorts),
            "noise": _digest(noise),
            "noise_std_on_sum": f"{run.server.noise_std:.6g}",
        }
    return out


def print_startup(table: dict[str, Any]) -> None:
    print(f"\nSummed-noise variance, filtered / unfiltered, T = {table['T']} (BLT sens = {table['blt_sens']:.4f})")
    print("| filter / noise | impulse response (normalised) | simulated ± se | DOPPLER without normalisation |")
    print("|---|---|---|---|")
    for key, r in table["rows"].items():
        un = "—" if r["unnormalised"] is None else f"{r['unnormalised']:.4f}"
        print(f"| {key} | {r['impulse']:.4f} | {r['simulated']:.4f} ± {r['simulated_se']:.4f} | {un} |")


def print_run(r: dict[str, Any], dim: int) -> None:
    acc = r["final_eval_accuracy"]
    print(
        f"{r['arm']} lr {r['lr']:g} seed {r['seed']}: {r['rounds']} rounds in {r['seconds']} s, final accuracy "
        f"{'n/a' if acc is None else f'{100 * acc:.2f} %'}; per round ‖U_t‖/K̄ mean {r['signal_mean']:.3f} "
        f"(max {r['signal_max']:.3f}), noise norm mean {r['noise_mean']:.2f} (min {r['noise_min']:.2f}, max "
        f"{r['noise_max']:.2f}); summed over the run: signal {r['sum_signal_norm']:.2f}, noise "
        f"{r['sum_noise_norm']:.2f} (d = {dim})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", action="store_true", help="train the Gaussian and BLT no-filter arms (seed 0, lr 1.0)")
    ap.add_argument("--lrs", default="", help="comma-separated further server steps for the Gaussian no-filter arm")
    ap.add_argument("--shared", action="store_true", help="compare init, cohorts and noise across arms (seed 1)")
    ap.add_argument("--reps", type=int, default=200_000, help="simulated coordinates per ratio")
    ap.add_argument("--json", type=Path, default=None, help="write every number to this file")
    args = ap.parse_args()
    rounds = arm_config("gaussian+none", 0).rounds
    results: dict[str, Any] = {"startup": startup_table(rounds, args.reps)}
    print_startup(results["startup"])
    if args.shared:
        arms = [
            "gaussian+none",
            "gaussian+ema",
            "gaussian+doppler_v1",
            "gaussian+doppler_2nd",
            "gaussian+disk_lookahead",
        ]
        results["shared_seed1"] = shared_randomness(1, arms, rounds)
        print("\nSeed 1, digests of x0 / cohorts / noise rows per arm:")
        for arm, d in results["shared_seed1"].items():
            print(f"  {arm:24s} {d['x0']} {d['cohorts']} {d['noise']}  noise std on U_t {d['noise_std_on_sum']}")
    plan = ([("gaussian+none", 1.0), ("blt+none", 1.0)] if args.runs else []) + [
        ("gaussian+none", float(v)) for v in args.lrs.split(",") if v.strip()
    ]
    if plan:
        from fedsim.runner.build import prepare

        dim = prepare(arm_config("gaussian+none", 0)).num_params
        print()
        results["runs"] = []
        for arm, lr in plan:
            r = measured_run(arm, lr)
            results["runs"].append(r)
            print_run(r, dim)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
