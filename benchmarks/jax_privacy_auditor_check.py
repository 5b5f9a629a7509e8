"""fedsim's one-run bounds against jax_privacy 2.0's `CanaryScoreAuditor`, on identical scores.

jax_privacy needs jax, which the project does not depend on, so it lives in a side venv
(default /tmp/jaxp; build it with `python3 -m venv /tmp/jaxp && /tmp/jaxp/bin/pip install
"jax[cpu]" jax-privacy==2.0.0`). This script draws canary scores (several separations, sizes
and tie patterns), runs jax_privacy in that venv as a subprocess (JSON in, JSON out) and fedsim
here, and compares

- `epsilon_one_run` (Steinke–Nasr–Jagielski) with fedsim's `one_run_bound(method="snj",
  selection="frontier")`, and
- `epsilon_one_run_fdp` (Mahloujifar et al.) with `one_run_bound(method="fdp",
  selection="frontier")`,

both with jax_privacy's default `Bonferroni()` threshold strategy, and prints the largest
absolute difference. Exit status 1 if any differs by more than `--tol` (default 1e-6).

Usage: .venv/bin/python benchmarks/jax_privacy_auditor_check.py [--python /tmp/jaxp/bin/python]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

import numpy as np

from fedsim.attacks.one_run import one_run_bound_in_out

_JAX_SIDE = r"""
import json, sys
from jax_privacy.auditing import CanaryScoreAuditor
cases = json.load(sys.stdin)
out = []
for c in cases:
    a = CanaryScoreAuditor(c["in"], c["out"])
    out.append({
        "snj": float(a.epsilon_one_run(c["significance"], c["delta"])),
        "fdp": float(a.epsilon_one_run_fdp(c["significance"], c["delta"])),
    })
json.dump(out, sys.stdout)
"""


def cases(seed: int = 0) -> list[dict[str, Any]]:
    """Score sets: Gaussian in/out scores at several separations, sizes, δ and confidences,
    some rounded to create ties, and one perfectly separated set."""
    rng = np.random.default_rng(seed)
    out = []
    for m, shift, delta, sig, decimals in [
        (200, 1.0, 1e-5, 0.05, None),
        (1000, 2.0, 1e-5, 0.05, None),
        (1000, 4.0, 1e-6, 0.05, None),
        (1000, 0.5, 1e-5, 0.1, None),
        (2000, 3.0, 1e-5, 0.05, 1),
        (500, 6.0, 1e-5, 0.01, None),
        (1000, 0.0, 1e-5, 0.05, None),
    ]:
        inc = rng.random(m) < 0.5
        s = rng.normal(size=m) + shift * inc
        if decimals is not None:
            s = np.round(s, decimals)
        out.append(
            {
                "in": s[inc].tolist(),
                "out": s[~inc].tolist(),
                "delta": delta,
                "significance": sig,
                "m": m,
                "shift": shift,
            }
        )
    sep = np.arange(400, dtype=np.float64)
    out.append(
        {
            "in": sep[200:].tolist(),
            "out": sep[:200].tolist(),
            "delta": 1e-5,
            "significance": 0.05,
            "m": 400,
            "shift": "perfect",
        }
    )
    return out


def run_jax(python: str, data: list[dict[str, Any]]) -> list[dict[str, float]]:
    """jax_privacy's bounds for `data`, computed by `python` (the side venv's interpreter)."""
    res = subprocess.run(
        [python, "-c", _JAX_SIDE], input=json.dumps(data), capture_output=True, text=True, check=True, timeout=600
    )
    return json.loads(res.stdout)


def compare(python: str, tol: float = 1e-6) -> list[dict[str, Any]]:
    """Rows with both libraries' bounds and their difference for every case."""
    data = cases()
    theirs = run_jax(python, data)
    rows = []
    for c, t in zip(data, theirs, strict=True):
        for method in ("snj", "fdp"):
            ours = one_run_bound_in_out(
                c["in"], c["out"], c["delta"], confidence=1 - c["significance"], method=method, selection="frontier"
            )
            rows.append(
                {
                    "m": c["m"],
                    "shift": c["shift"],
                    "delta": c["delta"],
                    "significance": c["significance"],
                    "method": method,
                    "jax_privacy": t[method],
                    "fedsim": ours.epsilon,
                    "abs_diff": abs(t[method] - ours.epsilon),
                    "ok": abs(t[method] - ours.epsilon) <= tol,
                }
            )
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python", default="/tmp/jaxp/bin/python", help="the side venv's python with jax-privacy")
    p.add_argument("--tol", type=float, default=1e-6, help="largest allowed absolute difference in epsilon")
    args = p.parse_args()
    rows = compare(args.python, args.tol)
    for r in rows:
        print(
            f"m={r['m']:5d} shift={r['shift']!s:8s} delta={r['delta']:.0e} a={r['significance']:.2f} "
            f"{r['method']:3s}  jax_privacy={r['jax_privacy']:.9f}  fedsim={r['fedsim']:.9f}  diff={r['abs_diff']:.1e}"
        )
    worst = max(r["abs_diff"] for r in rows)
    print(f"largest |difference| = {worst:.2e} over {len(rows)} bounds (tolerance {args.tol:g})")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
