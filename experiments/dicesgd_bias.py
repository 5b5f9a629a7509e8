"""DiceSGD's clipping bias, and whether error feedback removes it (issue 4, experiment 3).

Part A — the one-dimensional Huber example of the DiceSGD paper (Zhang et al.) Appendix B.1, exactly:
``f(x, ξ)`` is the Huber loss with threshold ``C' = ⌈C⌉ + 1``, ``N = C' + 1`` samples at
``ξ = −1`` (``C'`` times) and ``ξ = C'`` (once), per-sample clip ``C``. The minimiser is
``x* = 0``; clipped GD stalls at ``x̃ = C/C' − 1`` (docs/algorithms.md's corrected fixed point).
Full participation, no noise, gradient step ``η``.

Part B — a federated version with heterogeneous users and DP noise, run through fedsim's
own server pieces (:class:`fedsim.server.step.DPServer` with its fixed denominator, the Poisson
sampler, Gaussian noise, the ledger, :mod:`fedsim.training.error_feedback`'s server state); only the
Flower transport is left out. The users' client error-feedback rule runs vectorised over the cohort
(:func:`ef_messages`), checked at start against fedsim's ``client_ef_update`` on random cases. ``N`` users with 1-D Huber objectives (threshold ``C'``) centred at ``ξ_i``: 90 %
at −1, 10 % at +9 (a minority far away). Each participating user takes one local step
``Δ_i = −η ∇f(x, ξ_i)``. Clipped DP-FedAvg converges near ``x̃``, the root of
``Σ_i clip(−η∇f(x, ξ_i), c) = 0``; the true minimiser ``x*`` is the root of
``Σ_i ∇f(x, ξ_i) = 0``. Both roots are computed independently by bisection. Reported: the
mean of ``x`` over the last quarter of the rounds, mean ± std over seeds, per variant.

Part C — client error feedback against its control, plain clipping at ``c₁ + c₂`` (the same bound
on a message, so the same noise and ε; the same seeds, so the same cohorts and noise draws: the
differences are paired), for ``c₂ = c₁`` and ``c₂ = 10·c₁``, with the kept-state options
``client.ef_state_bound`` (``B = c₂``) and ``client.ef_decay`` (``β = 0.9``, ``0.5``); with
deterministic deltas and with zero-mean Gaussian local noise on every delta (``--local-noise``).
Reported per variant: ``x`` over the last quarter, its RMS distance to ``x*``, the largest
``|e_i|`` at the end, and the paired differences to the control with 95 % t-intervals.

Run: ``python experiments/dicesgd_bias.py [--seeds 5] [--rounds 2000] [--fix-seeds 10]
[--local-noise 0,1] [--only-c]``; results in ``experiments/README.md``.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
from typing import cast

import numpy as np
import torch

from fedsim.privacy.accounting import AccountingSpec, epsilon
from fedsim.privacy.ledger import Ledger
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


def ef_messages(
    delta: np.ndarray, e: np.ndarray, c1: float, c2: float, bound: float | None, decay: float | None
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`fedsim.training.error_feedback.client_ef_update` for many one-dimensional users at once
    (float64): ``u = clip(Δ, c₁) + clip(e, c₂)``, kept ``clip(β·(e + Δ − u), B)``. Checked against
    fedsim's function by :func:`check_ef_messages` before any run."""
    u = np.clip(delta, -c1, c1) + np.clip(e, -c2, c2)
    kept = e + delta - u
    if decay is not None:
        kept = kept * decay
    if bound is not None:
        kept = np.clip(kept, -bound, bound)
    return u, kept


def check_ef_messages(trials: int = 500) -> None:
    """:func:`ef_messages` equals fedsim's ``client_ef_update`` (float64 tensors) on random cases."""
    rng = np.random.default_rng(7)
    for _ in range(trials):
        d, e = rng.normal(scale=3.0, size=2)
        c1 = float(rng.uniform(0.1, 2.0))
        c2 = c1 * float(rng.choice([1.0, 3.0, 10.0]))
        bound = None if rng.random() < 0.3 else float(rng.uniform(0.1, 5.0))
        decay = None if rng.random() < 0.3 else float(rng.uniform(0.1, 1.0))
        u, kept = ef_messages(np.array([d]), np.array([e]), c1, c2, bound, decay)
        ut, kt, _ = client_ef_update(
            torch.tensor([d], dtype=torch.float64), torch.tensor([e], dtype=torch.float64), c1, c2, bound, decay
        )
        assert abs(float(ut[0]) - u[0]) < 1e-9 and abs(float(kt[0]) - kept[0]) < 1e-9, (d, e, c1, c2, bound, decay)


@functools.cache
def run_epsilon(no_guarantee: bool, n_users: int, k_bar: int, z: float, rounds: int) -> float:
    """ε at δ = 1/N^1.1 of Part B's runs (the same for every variant with a guarantee: computed once)."""
    # server error feedback has no guarantee (ε = ∞, docs/algorithms.md §8): its spec says so
    spec = AccountingSpec("gaussian", "poisson", n_users, k_bar, z, 1.0 / n_users**1.1, no_guarantee=no_guarantee)
    return epsilon(spec, rounds)


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
    bound: float | None = None,
    decay: float | None = None,
    local_noise: float = 0.0,
) -> dict:
    """One run. ``mode``: ``none`` (clip at ``c``), ``client`` (``c₁ = c``, ``c₂ = c2_factor·c``,
    with the kept-state options ``bound``, ``decay``) or ``server``. ``local_noise``: std of a
    zero-mean Gaussian added to every delta (a user's stochastic local training), drawn from the
    seed so that every variant of one seed sees the same draws. Returns the mean and the RMS of
    ``x − x*`` over the last quarter, ε, the trajectory and the largest ``|e_i|`` at the end."""
    rng = np.random.default_rng(1234)  # the population is the same for every seed
    xi = np.where(rng.random(n_users) < 0.1, 9.0, -1.0)
    local = np.random.default_rng(seed + 20_000)
    sampler = make_sampler(make_scheme("poisson", n_users, k_bar), seed)
    c1, c2 = c, c * c2_factor
    noise_norm = {"none": c1, "client": c1 + c2, "server": server_noise_norm(c1, c2)}[mode]
    server_ef = ServerErrorFeedback(1, c2) if mode == "server" else None
    server = DPServer(
        torch.tensor([3.0]),
        gaussian_noise(1, seed + 10_000),
        make_optimizer("sgd", server_lr),
        cast(Ledger, _RoundCounter()),
        noise_norm,
        z,
        k_bar,
        error_feedback=server_ef,
    )
    states = np.zeros(n_users)
    trajectory = []
    for t in range(rounds):
        x = float(server.params[0])
        users = np.array(sampler.sample(t), dtype=int)
        delta = -eta * huber_grad(x, xi[users], cp)
        if local_noise:
            delta = delta + local_noise * local.standard_normal(len(users))
        clipped = np.clip(delta, -c1, c1)
        residual = None
        if mode == "client":
            u, states[users] = ef_messages(delta, states[users], c1, c2, bound, decay)
        else:
            u = clipped
            if mode == "server":
                residual = torch.tensor([float((delta - clipped).sum())])
        server.step(torch.tensor([float(u.sum())]), len(users), residual_sum=residual)
        trajectory.append(float(server.params[0]))
    late = np.array(trajectory[rounds * 3 // 4 :])
    x_star = fixed_points()[0]
    return {
        "mean": float(late.mean()),
        "rms": float(np.sqrt(np.mean((late - x_star) ** 2))),
        "eps": run_epsilon(mode == "server", n_users, k_bar, z, rounds),
        "trajectory": trajectory,
        "max_state": float(np.abs(states).max()),
    }


@functools.cache
def fixed_points(n_users: int = 1000, c: float = 0.5, eta: float = 1.0, cp: float = 5.0) -> tuple[float, float]:
    rng = np.random.default_rng(1234)
    xi = np.where(rng.random(n_users) < 0.1, 9.0, -1.0)
    x_star = bisect(lambda x: float(huber_grad(x, xi, cp).sum()), -20, 20)
    x_tilde = bisect(lambda x: float(np.clip(-eta * huber_grad(x, xi, cp), -c, c).sum()), -20, 20)
    return x_star, x_tilde


#: Part C's client error-feedback variants: name -> kept-state options (``B`` as a multiple of ``c₂``).
FIXES: dict[str, dict[str, float]] = {
    "client EF (state kept whole)": {},
    "bound B = c₂": {"bound": 1.0},
    "decay β = 0.9": {"decay": 0.9},
    "decay β = 0.5": {"decay": 0.5},
}


def paired(diffs: list[float]) -> str:
    """Mean of paired differences with its two-sided 95 % t-interval."""
    from scipy.stats import t as student

    n = len(diffs)
    m = statistics.mean(diffs)
    if n < 2:
        return f"{m:+.4f}"
    half = student.ppf(0.975, n - 1) * statistics.stdev(diffs) / math.sqrt(n)
    return f"{m:+.4f} [{m - half:+.4f}, {m + half:+.4f}]"


def part_c(seeds: int, rounds: int, local_noise: float, c1: float = 0.5) -> None:
    """Client error feedback and its kept-state fixes against plain clipping at ``c₁ + c₂``, at equal
    noise and ε (the same ``c₁ + c₂``, the same seeds: the same cohorts and noise draws)."""
    print(
        f"\nPart C: paired against plain clipping at c₁ + c₂ (same noise, same ε), local noise std "
        f"{local_noise:g}, {seeds} seeds, {rounds} rounds; RMS = √mean((x − x*)²) over the last quarter"
    )
    print(
        "| c₂ | variant | x (last quarter) | RMS | max abs(e_i) at the end | RMS − plain's [95 % CI] | x − plain's [95 % CI] |"
    )
    print("|---|---|---|---|---|---|---|")
    for f2 in (1.0, 10.0):
        c2 = c1 * f2
        plain = [part_b("none", s, rounds, c=c1 + c2, local_noise=local_noise) for s in range(seeds)]
        rows = [(f"plain clipping at c₁ + c₂ = {c1 + c2:g}", plain)]
        for name, opts in FIXES.items():
            bound = opts["bound"] * c2 if "bound" in opts else None
            decay = opts.get("decay")
            runs = [
                part_b("client", s, rounds, c=c1, c2_factor=f2, bound=bound, decay=decay, local_noise=local_noise)
                for s in range(seeds)
            ]
            rows.append((name, runs))
        for name, runs in rows:
            means = [r["mean"] for r in runs]
            rms = statistics.mean(r["rms"] for r in runs)
            state = "—" if runs is plain else f"{max(r['max_state'] for r in runs):.3g}"
            d_rms = "—" if runs is plain else paired([r["rms"] - p["rms"] for r, p in zip(runs, plain)])
            d_x = "—" if runs is plain else paired([r["mean"] - p["mean"] for r, p in zip(runs, plain)])
            sd = statistics.stdev(means) if len(means) > 1 else 0.0
            print(
                f"| {f2:g}·c₁ | {name} | {statistics.mean(means):.4f} ± {sd:.4f} | {rms:.4f} | {state} | {d_rms} | {d_x} |"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--plot", type=str, default=None, help="write Part B's x against round (seed 0) to this PNG")
    ap.add_argument("--fix-seeds", type=int, default=10, help="seeds of Part C (0 skips it)")
    ap.add_argument("--local-noise", default="0,1", help="comma-separated local-noise stds of Part C (one table each)")
    ap.add_argument("--only-c", action="store_true", help="run only Part C")
    args = ap.parse_args()
    check_ef_messages()
    if args.fix_seeds:
        for ln in args.local_noise.split(","):
            part_c(args.fix_seeds, args.rounds, float(ln))
    if args.only_c:
        return
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
            r = part_b(mode, s, args.rounds, c2_factor=f2)
            vals.append(r["mean"])
            eps = r["eps"]
            if s == 0:
                curves[mode if mode != "client" else f"client, c₂ = {f2:g}·c₁"] = r["trajectory"]
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
