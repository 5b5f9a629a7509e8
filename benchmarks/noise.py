"""Streaming noise generation: per-round time and peak extra memory at d = 4,050,748.

Measures fedsim's noise mechanisms (``fedsim.privacy.noise``) at rounds 1, 1024 and
2048 of an ``n = 2048`` run, for the Stack Overflow LSTM size. Each (mechanism,
round) runs in its own subprocess, and peak extra memory is that process's peak RSS
minus its RSS after imports (``ru_maxrss``).

Timing does not depend on the values of ``C``, so a fixed synthetic strategy is used
for each family: a random ``b``-banded lower-triangular matrix for ``banded``, and
the sqrt-Toeplitz ``C`` for the dense ``C⁻¹`` (seeded regeneration of ``ξ_j``), and a
4-buffer BLT. To
reach round ``t`` of a streamed mechanism without drawing ``t`` rows first, the
mechanism's state is set to the size it has at round ``t``.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/noise.py --json [--quick]
    OMP_NUM_THREADS=1 python benchmarks/noise.py --rng [--reps 15]

``--quick`` uses d = 405,075 (a tenth) and rounds 1 and 256.

``--rng`` measures the keyed CSPRNG against torch's generator at d = 4,050,748 on one thread, in
one process with the three interleaved in every repetition (so machine load hits all alike):
``torch.randn`` (float32, Mersenne Twister — what fedsim used before), the AES-256-CTR keystream
alone (``rng.random_words``, 8 bytes per normal) and ``rng.gaussians`` (keystream + float64
Box–Muller + cast). It prints the medians, the ratio gaussians/randn (target ≤ 6) and the share
of one Stack Overflow LSTM round (the floor's per-round time in
``benchmarks/throughput_results_so_lstm.json``; target ≤ 3 %).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

D_FULL = 4_050_748


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def child(mechanism: str, d: int, t: int, n: int, bands: int) -> dict:
    import numpy as np
    import torch

    from fedsim.privacy.mechanisms.banded import BandedStream
    from fedsim.privacy.mechanisms.blt import BLTStream
    from fedsim.privacy.noise import MatrixStream, NoiseMechanism, gaussian_noise

    torch.set_num_threads(1)
    base = _rss_mb()
    if mechanism == "identity":
        noise = gaussian_noise(d, 0)
    elif mechanism == "banded":
        rng = np.random.default_rng(0)
        C = np.tril(rng.uniform(-0.1, 0.1, (n, n)))
        C[np.tril_indices(n, -bands)] = 0.0
        C[np.diag_indices(n)] = 1.0
        stream = BandedStream(C, 1.0)
        noise = NoiseMechanism(d, 0, "cpu", stream)
        stream.next_t = t
        if t > 0:
            stream._ring().normal_()  # state of round t: b − 1 stored rows (no temporaries)
    elif mechanism == "blt":
        theta, omega = np.array([0.99, 0.9, 0.6, 0.2]), np.array([0.05, 0.1, 0.1, 0.1])
        blt = BLTStream(theta, omega, 1.0)
        noise = NoiseMechanism(d, 0, "cpu", blt)
        if t > 0:
            blt.t = t
            blt.buffers = tuple(torch.empty(d).normal_() for _ in range(4))
    elif mechanism == "dense":
        from scipy.linalg import solve_triangular, toeplitz

        from fedsim.privacy.mechanisms.sqrt import sqrt_toeplitz_coefficients

        c = sqrt_toeplitz_coefficients(n)
        C = np.tril(toeplitz(c))
        M = solve_triangular(C, np.eye(n), lower=True)
        noise = NoiseMechanism(d, 0, "cpu", MatrixStream(M, 1.0, name="dense", memory_budget=0))
    else:
        raise SystemExit(f"unknown mechanism {mechanism}")
    ready = _rss_mb()
    t0 = time.perf_counter()
    row = noise.row(t)
    seconds = time.perf_counter() - t0
    assert row.shape == (d,)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "mechanism": mechanism,
        "d": d,
        "round": t + 1,
        "seconds": seconds,
        "state_mb": ready - base,
        "peak_extra_mb": peak - base,
        "peak_extra_in_d_floats": (peak - base) * 1024 * 1024 / (4 * d),
    }


def rng_benchmark(d: int, reps: int) -> dict:
    """Medians (ms) of torch.randn, the AES-CTR keystream and rng.gaussians, interleaved."""
    import statistics
    from pathlib import Path

    import torch

    from fedsim.privacy.rng import PrivacyKey, gaussians, random_words

    torch.set_num_threads(1)
    key = PrivacyKey.from_seed(0)
    gen = torch.Generator().manual_seed(0)
    times: dict[str, list[float]] = {"torch_randn": [], "aes_ctr_keystream": [], "rng_gaussians": []}
    for r in range(reps + 1):
        for name, fn in (
            ("torch_randn", lambda: torch.randn(d, generator=gen)),
            ("aes_ctr_keystream", lambda r=r: random_words(key.derive("w", r), d)),
            ("rng_gaussians", lambda r=r: gaussians(key.derive("g", r), d)),
        ):
            t0 = time.perf_counter()
            fn()
            if r:  # the first repetition warms up
                times[name].append(1e3 * (time.perf_counter() - t0))
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {
        "d": d,
        "reps": reps,
        **{f"{k}_ms": v for k, v in med.items()},
        "ratio_gaussians_to_randn": med["rng_gaussians"] / med["torch_randn"],
    }
    res = Path(__file__).with_name("throughput_results_so_lstm.json")
    if res.exists():
        floor = [r for r in json.loads(res.read_text()) if r.get("system") == "floor"]
        if floor:
            out["so_lstm_round_s"] = floor[0]["per_round_s"]
            out["share_of_so_lstm_round"] = med["rng_gaussians"] / 1e3 / floor[0]["per_round_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--bands", type=int, default=64)
    ap.add_argument("--child", nargs=3, metavar=("MECH", "D", "T"))
    ap.add_argument("--rng", action="store_true", help="the CSPRNG against torch.randn (see above)")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    if args.rng:
        print(json.dumps(rng_benchmark(D_FULL // 10 if args.quick else D_FULL, args.reps), indent=1))
        return
    n = 2048
    if args.child:
        mech, d, t = args.child
        print(json.dumps(child(mech, int(d), int(t), n, args.bands)))
        return
    d = D_FULL // 10 if args.quick else D_FULL
    rounds = [0, 255] if args.quick else [0, 1023, 2047]
    rows = []
    for t in rounds:
        for mech in ("identity", "banded", "blt", "dense"):
            out = subprocess.run(
                [sys.executable, __file__, "--bands", str(args.bands), "--child", mech, str(d), str(t)],
                capture_output=True,
                text=True,
                check=True,
            )
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            if not args.json:
                print(rows[-1], flush=True)
    by = {(r["mechanism"], r["round"]): r for r in rows}
    for r in rows:
        r["time_ratio_to_identity"] = r["seconds"] / by[("identity", r["round"])]["seconds"]
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
