"""How much of the DP noise a server filter keeps out of the iterates, at the default experiment's
scale, under its BLT noise and under independent Gaussian noise (issue 38, the default-scale rows of
experiments/README.md's paper-claims table).

With server SGD at step ``η`` the model carries the noise ``e_t = −η·Σ_{s≤t} m̂_s``, where ``m̂`` is the
filter's output on the noise stream ``n = σ·M·Z`` (``M = C⁻¹`` for MF noise, ``M = I`` for independent
noise, ``σ`` the noise's standard deviation per coordinate in ``ĝ``). Every step is linear, so per
coordinate

    Var(e_t) = (η·σ)² · ‖(S·H·M)[t, :]‖²,

with ``S`` the lower-triangular matrix of ones and ``H`` the filter's impulse response from its
zero-history start (start-up normalisation included; ``H = I`` without a filter). The script prints,
for each noise and filter, the mean over the rounds of ``Var(e_t)`` (the noise in the models the
clients train from) and the final ``Var(e_{n−1})`` (the noise in the evaluated model), in units of
``σ²`` of that noise and relative to no filter.

It builds each experiment's plan with fedsim (``prepare``: the mechanism's ``C⁻¹``, ``sens`` and the
``z`` calibrated to ε = 8), so the numbers are those of the runs. Run::

    python experiments/iterate_noise.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

#: the experiments compared: the default (BLT, epochs) and its independent-noise counterpart
EXPERIMENTS = ("shakespeare_default", "shakespeare_gaussian")
#: the server filters of the default-scale sweep (experiments/sweeps/default_scale.toml)
FILTERS: dict[str, dict[str, Any]] = {
    "none": {"name": "none"},
    "doppler first_order_v1": {"name": "doppler", "preset": "first_order_v1"},
    "ema κ = 0.7 (DiSK's server side)": {"name": "ema", "kappa": 0.7},
}


def noise_rows(experiment: str) -> tuple[np.ndarray, float, int]:
    """``M`` (``n_t = σ·(M·Z)_t``), ``σ`` per coordinate of ``ĝ`` (``c·z·sens/K̄``) and ``n`` of ``experiment``."""
    from fedsim.config import load_config
    from fedsim.runner.build import prepare

    prep = prepare(load_config(experiment, []))
    n, cfg = prep.cfg.rounds, prep.cfg
    sens = 1.0
    m = np.eye(n)
    if prep.plan is not None:
        m, sens = np.asarray(prep.plan.noising, dtype=np.float64), float(prep.plan.sens)
    sigma = cfg.client.clip_norm * prep.update_noise_multiplier * sens / prep.spec.cohort_size
    return m, float(sigma), n


def iterate_variance(m: np.ndarray, filt: dict[str, Any]) -> np.ndarray:
    """``‖(S·H·M)[t, :]‖²`` for every round ``t``: the per-coordinate variance of the noise the iterate
    carries after round ``t``, in units of ``(η·σ)²``."""
    from fedsim.server.filters import make_filter

    opts = dict(filt)
    h = make_filter(opts.pop("name"), **opts).impulse_response(m.shape[0])
    summed = np.cumsum(h @ m, axis=0)  # S·H·M
    return np.sum(summed**2, axis=1)


def table() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for experiment in EXPERIMENTS:
        m, sigma, n = noise_rows(experiment)
        rows = {name: iterate_variance(m, f) for name, f in FILTERS.items()}
        base = rows["none"]
        out[experiment] = {
            "rounds": n,
            "sigma": sigma,
            "filters": {
                name: {
                    "mean_var": float(v.mean()),
                    "final_var": float(v[-1]),
                    "mean_vs_none": float(v.mean() / base.mean()),
                    "final_vs_none": float(v[-1] / base[-1]),
                    "mean_var_abs": float(v.mean() * sigma**2),
                }
                for name, v in rows.items()
            },
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="also write the numbers to this JSON file")
    args = ap.parse_args()
    result = table()
    for experiment, r in result.items():
        print(f"\n{experiment}: n = {r['rounds']}, σ = c·z·sens/K̄ = {r['sigma']:.4f} per coordinate of ĝ")
        print("| filter | mean_t Var(e_t) / (ησ)² | vs none | Var(e_final) / (ησ)² | vs none | mean_t Var(e_t) / η² |")
        print("|---|---|---|---|---|---|")
        for name, f in r["filters"].items():
            print(
                f"| {name} | {f['mean_var']:.2f} | {f['mean_vs_none']:.3f} | {f['final_var']:.2f} | "
                f"{f['final_vs_none']:.3f} | {f['mean_var_abs']:.3g} |"
            )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
