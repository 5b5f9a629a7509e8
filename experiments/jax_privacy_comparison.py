"""fedsim's matrix factorizations vs. Google DeepMind's ``jax_privacy.matrix_factorization``.

The issue asks to check fedsim's numbers against the reference implementation, with
jax-privacy installed in a throwaway environment (it must NOT become a dependency of
fedsim). Setup, outside the repository::

    python3 -m venv /tmp/jaxenv
    /tmp/jaxenv/bin/pip install jax jaxlib jax-privacy

Run (from the repository root)::

    OMP_NUM_THREADS=1 XLA_FLAGS=--xla_cpu_multi_thread_eigen=false \\
        .venv/bin/python experiments/jax_privacy_comparison.py [--jax-python /tmp/jaxenv/bin/python] \\
        [--json out.json]

The fedsim side runs in this interpreter with ``FEDSIM_CACHE`` pointed at a fresh temporary
folder (so the dense factorizations are really computed, not read from the cache). If the
jax interpreter exists, this same file is run under it with ``--jax-side``; that mode
imports only jax / jax_privacy / numpy, never fedsim.

One loss for every case (fedsim's): ``loss = sens² · ‖A C⁻¹‖_F²`` for the prefix-sum
workload ``A``, i.e. the TOTAL squared error over all ``n`` prefix sums, ``sens`` under the
case's participation scheme. jax_privacy's reductions are per-query MEANS
(``jnp.mean`` of the row norms of ``B``), so jax numbers are converted by ``× n``; its
banded strategies are column-normalised with single-participation sensitivity 1, so under
``min_sep (k, b)`` with ``bands ≤ b`` the conversion is ``× n · k`` (the script also checks
``k`` against jax_privacy's own ``sensitivity.get_sensitivity_banded``). Dense strategies
from jax are evaluated directly as ``max_j ‖C[:, j]‖² · ‖A C⁻¹‖_F²`` in numpy.

Cases:
  dense n=64, n=256      single participation (jax: ``dense.optimize``; once with its
                         default stopping rule, max |projected grad| ≤ 1e-3 on the mean loss,
                         and once with ≤ 1e-6).
  banded n=256, b=16     min_sep (k=16, b=16). jax: ``banded.optimize`` (column-normalised
                         banded C, L-BFGS on C, default 100 steps) and ``dense.optimize(bands=16,
                         equal_norm=True)`` (the convex X = CᵀC formulation with a banded mask;
                         same feasible set, global optimum).
  blt n=256, n=2048      4 buffers, single participation, mean (= total/n) error.
                         jax: ``buffered_toeplitz.optimize_loss(LossFn.build_min_sep(n,
                         error='mean', min_sep=1, max_participations=1), num_buffers=4)``.
  sqrt n=256             ``toeplitz.loss(optimal_max_error_strategy_coefs(n), reduction_fn=mean)``.

Times are wall-clock seconds of one cold call in a fresh process (jax's include JIT
compilation; fedsim's dense include the eigendecompositions, no cache).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

DENSE_NS = (64, 256)
BANDED = {"n": 256, "bands": 16}
BLT_NS = (256, 2048)
BLT_BUFFERS = 4
SQRT_N = 256
DEFAULT_JAX_PYTHON = "/tmp/jaxenv/bin/python"


# --------------------------------------------------------------------------- jax side


def _jax_side() -> list[dict]:
    """Run every case with jax_privacy; returns rows with ``loss`` in fedsim's units."""
    import importlib.metadata

    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    from jax_privacy.matrix_factorization import banded, buffered_toeplitz, dense, sensitivity, toeplitz

    version = importlib.metadata.version("jax-privacy")
    rows: list[dict] = []

    def total_loss_dense(C: np.ndarray, sens2: float | None = None) -> float:
        C = np.asarray(C, dtype=np.float64)
        n = C.shape[0]
        B = np.linalg.solve(C.T, np.tri(n).T).T  # B = A C^{-1}
        if sens2 is None:
            sens2 = float(np.max(np.sum(C * C, axis=0)))
        return float(sens2 * np.sum(B * B))

    def pg_callback(tol: float, counter: list):
        def cb(args) -> bool:
            counter[0] = args.step + 1
            return bool(jnp.abs(args.grad).max() <= tol)

        return cb

    # (i) dense, single participation
    for n in DENSE_NS:
        for tol in (1e-3, 1e-6):
            steps = [0]
            t = time.perf_counter()
            C = dense.optimize(n, callback=pg_callback(tol, steps), max_optimizer_steps=10_000)
            C = np.asarray(C)
            sec = time.perf_counter() - t
            rows.append(
                {
                    "case": f"dense n={n}",
                    "variant": f"dense.optimize, pg tol {tol:g}" + (" (default)" if tol == 1e-3 else ""),
                    "loss": total_loss_dense(C),
                    "seconds": sec,
                    "steps": steps[0],
                }
            )

    # (ii) banded, min_sep (k, b) with k = ceil(n / b)
    n, b = BANDED["n"], BANDED["bands"]
    k = math.ceil(n / b)
    t = time.perf_counter()
    strat = banded.optimize(n, bands=b)
    per_query = banded.per_query_error(strat)
    mean_err = float(jnp.mean(per_query))
    sec = time.perf_counter() - t
    Cm = np.asarray(strat.materialize())
    sens2_jax = sensitivity.get_sensitivity_banded(jnp.asarray(Cm), min_sep=b, max_participations=k) ** 2
    sens2_conv = banded.minsep_sensitivity_squared(strat, min_sep=b, max_participations=k)
    rows.append(
        {
            "case": f"banded n={n} b={b} k={k}",
            "variant": "banded.optimize (default 100 steps)",
            "loss": float(sens2_conv * n * mean_err),
            "seconds": sec,
            "jax_mean_error": mean_err,
            "sens2_minsep_jax": float(sens2_jax),
            "sens2_conversion": float(sens2_conv),
            "loss_direct": total_loss_dense(Cm, float(sens2_jax)),
        }
    )
    steps = [0]
    t = time.perf_counter()
    C = np.asarray(
        dense.optimize(n, bands=b, equal_norm=True, callback=pg_callback(1e-6, steps), max_optimizer_steps=10_000)
    )
    sec = time.perf_counter() - t
    sens2_jax = sensitivity.get_sensitivity_banded(jnp.asarray(C), min_sep=b, max_participations=k) ** 2
    rows.append(
        {
            "case": f"banded n={n} b={b} k={k}",
            "variant": "dense.optimize(bands=16, equal_norm=True), pg tol 1e-06",
            "loss": total_loss_dense(C, float(sens2_jax)),
            "seconds": sec,
            "steps": steps[0],
            "sens2_minsep_jax": float(sens2_jax),
            "max_offband": float(np.max(np.abs(np.tril(C, -b)))),
        }
    )

    # (iii) BLT, 4 buffers, single participation, mean error
    for n in BLT_NS:
        loss_fn = buffered_toeplitz.LossFn.build_min_sep(n, error="mean", min_sep=1, max_participations=1)
        t = time.perf_counter()
        blt, loss = buffered_toeplitz.optimize_loss(loss_fn, num_buffers=BLT_BUFFERS)
        loss = float(loss)
        sec = time.perf_counter() - t
        rows.append(
            {
                "case": f"blt n={n} m={BLT_BUFFERS}",
                "variant": "buffered_toeplitz.optimize_loss (mean)",
                "loss": n * loss,
                "seconds": sec,
                "jax_mean_loss": loss,
                "theta": [float(x) for x in np.asarray(blt.buf_decay)],
                "omega": [float(x) for x in np.asarray(blt.output_scale)],
            }
        )

    # (iv) sqrt Toeplitz
    n = SQRT_N
    t = time.perf_counter()
    coef = toeplitz.optimal_max_error_strategy_coefs(n)
    mean_loss = float(toeplitz.loss(coef, n=n, reduction_fn=jnp.mean))
    sec = time.perf_counter() - t
    rows.append(
        {
            "case": f"sqrt n={n}",
            "variant": "toeplitz.loss(optimal_max_error_strategy_coefs)",
            "loss": n * mean_loss,
            "seconds": sec,
            "jax_mean_loss": mean_loss,
        }
    )

    for r in rows:
        r["jax_privacy_version"] = version
        r["jax_version"] = jax.__version__
    return rows


# --------------------------------------------------------------------------- fedsim side


def _fedsim_side() -> list[dict]:
    """Every case with fedsim, ``loss`` = ``sens² · ‖A C⁻¹‖_F²``."""
    from fedsim.privacy.mechanisms.banded import optimize_banded
    from fedsim.privacy.mechanisms.blt import optimize_blt
    from fedsim.privacy.mechanisms.dense import factorize_dense
    from fedsim.privacy.mechanisms.sqrt import sqrt_toeplitz
    from fedsim.privacy.workloads import prefix_sum

    rows: list[dict] = []
    for n in DENSE_NS:
        t = time.perf_counter()
        f = factorize_dense(prefix_sum(n))
        sec = time.perf_counter() - t
        rows.append(
            {
                "case": f"dense n={n}",
                "loss": f.loss(),
                "seconds": sec,
                "dual": f.info.get("dual"),
                "rel_gap": f.info.get("rel_gap"),
                "iterations": f.info.get("iterations"),
                "cache": f.info.get("cache"),
            }
        )

    n, b = BANDED["n"], BANDED["bands"]
    k = math.ceil(n / b)
    t = time.perf_counter()
    _, info = optimize_banded(prefix_sum(n), b, max_participations=k)
    sec = time.perf_counter() - t
    rows.append(
        {
            "case": f"banded n={n} b={b} k={k}",
            "loss": info["loss"],
            "seconds": sec,
            "sensitivity_squared": info["sensitivity_squared"],
            "iterations": info["iterations"],
            "converged": info["converged"],
        }
    )

    for n in BLT_NS:
        t = time.perf_counter()
        _, _, info = optimize_blt(n, BLT_BUFFERS)
        sec = time.perf_counter() - t
        rows.append(
            {
                "case": f"blt n={n} m={BLT_BUFFERS}",
                "loss": info["loss"],
                "seconds": sec,
                "iterations": info["iterations"],
                "converged": info["converged"],
            }
        )

    n = SQRT_N
    t = time.perf_counter()
    f = sqrt_toeplitz(prefix_sum(n))
    loss = f.loss()
    sec = time.perf_counter() - t
    rows.append({"case": f"sqrt n={n}", "loss": loss, "seconds": sec})
    return rows


def _fedsim_eval_jax_blt(jax_rows: list[dict]) -> dict[str, float]:
    """fedsim's ``blt_errors`` on jax_privacy's optimised BLT parameters (same (θ, ω) convention)."""
    from fedsim.privacy.mechanisms.blt import blt_errors

    out = {}
    for r in jax_rows:
        if r["case"].startswith("blt"):
            n = int(r["case"].split("n=")[1].split()[0])
            out[r["case"]] = float(blt_errors(r["theta"], r["omega"], n)["loss"])
    return out


# --------------------------------------------------------------------------- main


def _table(fed: list[dict], jax_rows: list[dict], cross: dict[str, float]) -> str:
    lines = [
        "| case | jax_privacy variant | fedsim loss | jax_privacy loss | rel. diff (fedsim − jax)/jax "
        "| fedsim s | jax_privacy s |",
        "|---|---|---|---|---|---|---|",
    ]
    by_case = {r["case"]: r for r in fed}
    for j in jax_rows:
        f = by_case.get(j["case"])
        if f is None:
            continue
        rel = (f["loss"] - j["loss"]) / j["loss"]
        lines.append(
            f"| {j['case']} | {j['variant']} | {f['loss']:.10g} | {j['loss']:.10g} | {rel:+.2e} "
            f"| {f['seconds']:.2f} | {j['seconds']:.2f} |"
        )
    if cross:
        lines.append("")
        lines.append(
            "jax_privacy's BLT parameters evaluated by fedsim's blt_errors: "
            + ", ".join(f"{c}: {v:.10g}" for c, v in cross.items())
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jax-side", action="store_true", help="(internal) run the jax_privacy side, print JSON")
    p.add_argument("--jax-python", default=DEFAULT_JAX_PYTHON, help="interpreter with jax-privacy installed")
    p.add_argument("--json", default=None, help="write all measurements to this file")
    args = p.parse_args(argv)

    if args.jax_side:
        print(json.dumps(_jax_side()))
        return 0

    os.environ["FEDSIM_CACHE"] = tempfile.mkdtemp(prefix="fedsim-cache-")
    fed = _fedsim_side()
    jax_rows: list[dict] = []
    if os.path.exists(args.jax_python):
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
        env.setdefault("JAX_PLATFORMS", "cpu")
        out = subprocess.run(
            [args.jax_python, os.path.abspath(__file__), "--jax-side"],
            env=env,
            cwd=tempfile.gettempdir(),
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            sys.stderr.write(out.stderr)
            raise SystemExit(f"the jax_privacy side failed (exit {out.returncode})")
        jax_rows = json.loads(out.stdout.strip().splitlines()[-1])
    else:
        print(f"{args.jax_python} not found: only the fedsim side was run", file=sys.stderr)
    cross = _fedsim_eval_jax_blt(jax_rows)

    if jax_rows:
        print(f"jax-privacy {jax_rows[0]['jax_privacy_version']}, jax {jax_rows[0]['jax_version']}")
        print(_table(fed, jax_rows, cross))
    else:
        for r in fed:
            print(f"{r['case']}: loss {r['loss']:.10g}, {r['seconds']:.2f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"fedsim": fed, "jax_privacy": jax_rows, "fedsim_eval_of_jax_blt": cross}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
