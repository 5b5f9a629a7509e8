"""What DP-Adam's and DP-AdamBC's second moments hold at the end of the default-scale sweep's trials
(issue 38; the DP-AdamBC row at the default scale in experiments/README.md).

Reads the final checkpoint of each evaluation seed's ``adam`` and ``adambc`` trial (the server
optimizer's ``m``, ``v`` and, for AdamBC, ``φ``) and the run's noise plan, and prints per trial:

- ``Φ`` terms: the expected DP-noise part of the bias-corrected second moment,
  ``φ̂ = φ_T/(1−β2^T)`` with ``φ_t = β2·φ_{t−1} + (1−β2)·Φ_t`` and ``Φ_t = (c·z·sens/K̄)²·‖(C⁻¹)[t,:]‖²``
  (the same recursion AdamBC runs; recomputed here from the plan for the Adam trials, and checked
  against AdamBC's own ``φ``);
- quantiles over the coordinates of ``v̂/φ̂`` (Adam: how far the second moment is above the noise's
  part) and of AdamBC's ``(v̂ − φ̂)/φ̂`` (its estimate of the signal's second moment, in units of
  the noise's), and the share of coordinates at AdamBC's floor ``γ′ = 0.01·Φ_T``;
- the per-coordinate step multiplier ``η/√v̂`` of AdamBC over Adam's at the tuned lrs.

Run after the sweeps (experiments/sweeps/default_scale*.toml)::

    python experiments/adam_states.py runs/default_scale_more [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import torch


def noise_variances(config_path: Path) -> tuple[np.ndarray, float]:
    """``Φ_t`` for every round of the trial's config (no filter), and the round count."""
    from fedsim.config import load_config
    from fedsim.runner.build import prepare

    prep = prepare(load_config(config_path, []))
    n = prep.cfg.rounds
    m, sens = (np.eye(n), 1.0) if prep.plan is None else (np.asarray(prep.plan.noising), float(prep.plan.sens))
    sigma = prep.cfg.client.clip_norm * prep.update_noise_multiplier * sens / prep.spec.cohort_size
    return sigma**2 * np.sum(m**2, axis=1), n


def phi_hat(big_phi: np.ndarray, beta2: float) -> tuple[float, float]:
    """``(φ_T, φ_T/(1−β2^T))`` from the per-round ``Φ_t``."""
    phi = 0.0
    for value in big_phi:
        phi = beta2 * phi + (1 - beta2) * float(value)
    return phi, phi / (1 - beta2 ** len(big_phi))


def trial_state(folder: Path) -> dict[str, Any]:
    ck = torch.load(folder / "checkpoint" / "checkpoint.pt", weights_only=False, map_location="cpu")
    cfg = tomllib.loads((folder / "config.toml").read_text(encoding="utf-8"))
    opt = ck["server"]["optimizer"]
    return {
        "v": opt["v"].double().numpy(),
        "phi": float(opt["phi"]) if opt.get("phi") is not None else None,
        "t": int(opt["t"]),
        "lr": float(cfg["server"]["lr"]),
        "beta2": float(cfg["server"]["beta2"]),
        "gamma_frac": float(cfg["server"].get("gamma_frac", 0.01)),
    }


def q(x: np.ndarray) -> dict[str, float]:
    return {f"q{int(p * 100)}": float(np.quantile(x, p)) for p in (0.1, 0.5, 0.9, 0.99)}


def analyse(out: Path) -> list[dict[str, Any]]:
    trials = sorted((out / "trials").iterdir())
    seeds = sorted({t.name.split("seed=")[1] for t in trials if t.name.startswith(("adam+", "adambc+"))})
    results = []
    big_phi, _ = noise_variances(next(t for t in trials if t.name.startswith("adam")) / "config.toml")
    for seed in seeds:
        adam = trial_state(next(t for t in trials if t.name.startswith("adam+") and t.name.endswith(f"seed={seed}")))
        bc = trial_state(next(t for t in trials if t.name.startswith("adambc+") and t.name.endswith(f"seed={seed}")))
        phi_t, phi_bc = phi_hat(big_phi, bc["beta2"])
        corr = 1 - bc["beta2"] ** bc["t"]
        v_adam = adam["v"] / (1 - adam["beta2"] ** adam["t"])
        signal_bc = (bc["v"] - bc["phi"]) / corr
        floor = bc["gamma_frac"] * float(big_phi[bc["t"] - 1])
        v_hat_bc = np.maximum(signal_bc, floor)
        multiplier = (bc["lr"] / np.sqrt(v_hat_bc)) / (adam["lr"] / np.sqrt(v_adam))
        results.append(
            {
                "seed": int(seed),
                "phi_check": {"recomputed": phi_t, "adambc_state": bc["phi"]},
                "phi_hat": phi_bc,
                "adam_v_over_phi": q(v_adam / phi_bc),
                "adambc_signal_over_phi": q(signal_bc / phi_bc),
                "adambc_at_floor": float(np.mean(signal_bc <= floor)),
                "step_multiplier_adambc_over_adam": q(multiplier),
                "lr": {"adam": adam["lr"], "adambc": bc["lr"]},
            }
        )
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="the sweep folder with the evaluation seeds' trials")
    ap.add_argument("--json", type=Path, help="also write the numbers to this JSON file")
    args = ap.parse_args()
    results = analyse(args.folder)
    for r in results:
        print(f"\nseed {r['seed']} (lr Adam {r['lr']['adam']:g}, AdamBC {r['lr']['adambc']:g}); φ̂ = {r['phi_hat']:.3g}")
        print(f"  φ_T recomputed {r['phi_check']['recomputed']:.6g}, AdamBC's own {r['phi_check']['adambc_state']:.6g}")
        for key in ("adam_v_over_phi", "adambc_signal_over_phi", "step_multiplier_adambc_over_adam"):
            print(f"  {key}: " + ", ".join(f"{k} {v:.3g}" for k, v in r[key].items()))
        print(f"  AdamBC coordinates at the floor: {r['adambc_at_floor']:.1%}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
