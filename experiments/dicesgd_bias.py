"""DiceSGD's clipping bias, and whether error feedback removes it (issue 4, experiment 3).

Part A — the one-dimensional Huber example of the DiceSGD paper (Zhang et al.) Appendix B.1, exactly:
``f(x, ξ)`` is the Huber loss with threshold ``C' = ⌈C⌉ + 1``, ``N = C' + 1`` samples at
``ξ = −1`` (``C'`` times) and ``ξ = C'`` (once), per-sample clip ``C``. The minimiser is
``x* = 0``; clipped GD stalls at ``x̃ = C/C' − 1`` (docs/algorithms.md's corrected fixed point).
Full participation, no noise, gradient step ``η``.

Part B — a federated version with heterogeneous users and DP noise, run through fedsim's
own server pieces (:class:`fedsim.server.step.DPServer` with its fixed denominator, the Poisson
sampler, Gaussian noise, the ledger, :mod:`fedsim.training.error_feedback`); only the Flower transport
is left out. ``N`` users with 1-D Huber objectives (threshold ``C'``) centred at ``ξ_i``: 90 %
at −1, 10 % at +9 (a minority far away). Each participating user takes one local step
``Δ_i = −η ∇f(x, ξ_i)``. Clipped DP-FedAvg converges near ``x̃``, the root of
``Σ_i clip(−η∇f(x, ξ_i), c) = 0``; the true minimiser ``x*`` is the root of
``Σ_i ∇f(x, ξ_i) = 0``. Both roots are computed independently by bisection. Reported: the
mean of ``x`` over the last quarter of the rounds, mean ± std over seeds, per variant.

Run: ``python experiments/dicesgd_bias.py [--seeds 5] [--rounds 4000]``; results in
``experiments/README.md``.
"""

from __future__ import annotations

import argparse
import math
import statistics

import numpy as np
import torch

from fedsim.privacy.accounting import AccountingSpec, epsilon
from fedsim.privacy.noise import gaussian_noise
from fedsim.privacy.participation import make_scheme
from fedsim.server.optim import make_optimizer
from fedsim.server.sampling import make_sampler
from fedsim.server.step import DPServer
from fedsim.training.error_feedback import ServerErrorFeedback, client_ef_update, server_noise_norm


def huber_grad(x: float, xi: np.ndarray, cp: float) -> np.ndarray:
    return np.clip(x - xi, -cp, cp)


def bisect(fn, lo: float, hi: float, iters: int = 200) -> float:
    flo = fn(lo)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        fm = fn(mid)
        if (fm > 0) == (flo > 0):
            lo, flo = mid, fm
        else:
            hi = mid
    return 0.5 * (lo + hi)


def part_a(c: float, eta: float = 0.5, rounds: int = 4000) -> dict[str, float]:
    cp = math.ceil(c) + 1.0
    xi = np.array([-1.0] * int(cp) + [cp])
    out = {"C": c, "C'": cp, "x_star": 0.0, "x_tilde": c / cp - 1}
    for mode in ("clipped", "client_ef", "server_ef"):
        x, e = 1.5, np.zeros(len(xi))
        es = 0.0
        for _ in range(rounds):
            delta = -eta * huber_grad(x, xi, cp)
            u = np.clip(delta, -eta * c, eta * c)
            if mode == "client_ef":
                u = u + np.clip(e, -eta * c, eta * c)
                e = e + delta - u
                x += u.mean()
            elif mode == "server_ef":
                fed = float(np.clip(es, -eta * c, eta * c))
                x += u.mean() + fed
                es = es - fed + (delta - np.clip(delta, -eta * c, eta * c)).mean()
            else:
                x += u.mean()
        out[mode] = x
    return out


class _RoundCounter:
    """Stands in for the ledger inside the loop (ε is computed once, at the end, from the spec
    with dp-accounting: recomputing the PLD every round would dominate the run time)."""

    def record_round(self, t: int, cohort: int, clip_norm: float | None = None) -> float:
        return float("nan")


def part_b(
    mode: str,
    seed: int,
    rounds: int,
    n_users: int = 1000,
    k_bar: int = 50,
    z: float = 1.0,
    c: float = 0.5,
    eta: float = 1.0,
    cp: float = 5.0,
    server_lr: float = 0.3,
    c2_factor: float = 1.0,
) -> tuple[float, float, list[float]]:
    rng = np.random.default_rng(1234)  # the population is the same for every seed
    xi = np.where(rng.random(n_users) < 0.1, 9.0, -1.0)
    # server error feedback has no guarantee (ε = ∞, docs/algorithms.md §8): its spec says so
    spec = AccountingSpec("gaussian", "poisson", n_users, k_bar, z, 1.0 / n_users**1.1, no_guarantee=mode == "server")
    sampler = make_sampler(make_scheme("poisson", n_users, k_bar), seed)
    c1, c2 = c, c * c2_factor
    noise_norm = {"none": c1, "client": c1 + c2, "server": server_noise_norm(c1, c2)}[mode]
    server_ef = ServerErrorFeedback(1, c2) if mode == "server" else None
    server = DPServer(
        torch.tensor([3.0]),
        gaussian_noise(1, seed + 10_000),
        make_optimizer("sgd", server_lr),
        _RoundCounter(),
        noise_norm,
        z,
        k_bar,
        error_feedback=server_ef,
    )
    states = np.zeros(n_users)
    late, trajectory = [], []
    for t in range(rounds):
        x = float(server.params[0])
        users = np.array(sampler.sample(t), dtype=int)
        delta = -eta * huber_grad(x, xi[users], cp)
        clipped = np.clip(delta, -c1, c1)
        residual = None
        if mode == "client":
            u = np.empty_like(delta)
            for j, i in enumerate(users):
                ut, en, _ = client_ef_update(torch.tensor([delta[j]]), torch.tensor([states[i]]), c1, c2)
                u[j], states[i] = float(ut[0]), float(en[0])
        else:
            u = clipped
            if mode == "server":
                residual = torch.tensor([float((delta - clipped).sum())])
        server.step(torch.tensor([float(u.sum())]), len(users), residual_sum=residual)
        trajectory.append(float(server.params[0]))
        if t >= rounds * 3 // 4:
            late.append(float(server.params[0]))
    return float(np.mean(late)), epsilon(spec, rounds), trajectory


def fixed_points(n_users: int = 1000, c: float = 0.5, eta: float = 1.0, cp: float = 5.0) -> tuple[float, float]:
    rng = np.random.default_rng(1234)
    xi = np.where(rng.random(n_users) < 0.1, 9.0, -1.0)
    x_star = bisect(lambda x: float(huber_grad(x, xi, cp).sum()), -20, 20)
    x_tilde = bisect(lambda x: float(np.clip(-eta * huber_grad(x, xi, cp), -c, c).sum()), -20, 20)
    return x_star, x_tilde


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--plot", type=str, default=None, help="write Part B's x against round (seed 0) to this PNG")
    args = ap.parse_args()
    print("Part A: Huber example (Appendix B.1), full participation, no noise, η = 0.5, 4000 steps")
    print("| C | C' | x* | x̃ = C/C'−1 | clipped GD | client EF | server EF |")
    print("|---|---|---|---|---|---|---|")
    for c in (0.5, 1.0, 2.0, 4.0):
        r = part_a(c)
        print(
            f"| {c} | {r[chr(67) + chr(39)]:.0f} | 0 | {r['x_tilde']:.4f} | {r['clipped']:.4f} | "
            f"{r['client_ef']:.2e} | {r['server_ef']:.2e} |"
        )
    x_star, x_tilde = fixed_points()
    print(
        f"\nPart B: N = 1000 heterogeneous users, Poisson K̄ = 50, z = 1, c₁ = 0.5, server lr 0.3, "
        f"{args.rounds} rounds, {args.seeds} seeds"
    )
    print(f"x* = {x_star:.4f} (Huber minimiser), x̃ = {x_tilde:.4f} (clipped fixed point)")
    print("| variant | mean x over last quarter (mean ± std over seeds) | |x − x*| | ε (δ = 1/N^1.1) |")
    print("|---|---|---|---|")
    curves = {}
    for mode, f2 in (("none", 1.0), ("client", 1.0), ("client", 10.0), ("server", 1.0)):
        vals, eps = [], None
        for s in range(args.seeds):
            v, eps, traj = part_b(mode, s, args.rounds, c2_factor=f2)
            vals.append(v)
            if s == 0:
                curves[mode if mode != "client" else f"client, c₂ = {f2:g}·c₁"] = traj
        m, sd = statistics.mean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0
        name = {
            "none": "clipped DP-FedAvg (c = 0.5)",
            "client": f"client error feedback, c₂ = {f2:g}·c₁ (noise ∝ c₁ + c₂ = {0.5 * (1 + f2):g})",
            "server": "server error feedback (no guarantee; noise ∝ √(c₁² + 2c₂²))",
        }[mode]
        print(f"| {name} | {m:.4f} ± {sd:.4f} | {abs(m - x_star):.4f} | {eps:.3f} |")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4.5))
        labels = {"none": "clipped DP-FedAvg", "server": "server EF (experimental)"}
        for key, traj in curves.items():
            ax.plot(traj, lw=0.8, label=labels[key] if key in labels else f"client EF ({key.split(', ')[1]})")
        ax.axhline(x_star, color="k", ls="--", lw=1, label=f"x* = {x_star:.3f}")
        ax.axhline(x_tilde, color="grey", ls=":", lw=1, label=f"x̃ (clipped fixed point) = {x_tilde:.3f}")
        ax.set_xlabel("round")
        ax.set_ylabel("x (server model), seed 0")
        ax.set_ylim(-1.6, 3.2)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
