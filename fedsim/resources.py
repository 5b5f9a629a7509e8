"""Resource estimates for a factorization, checked before anything is allocated.

Every matrix-factorization plan materialises ``n×n`` float64 matrices (the workload ``A``, the
strategy ``C``, its inverse, the decoder and the optimiser's temporaries); ``dense`` and
``dpmf_plus`` also run a fixed-point iteration with one ``n×n`` symmetric eigendecomposition per
step. :func:`check_factorization_fits` estimates both and refuses, in well under a second, a plan
that cannot fit this machine's available memory or would run for hours on its CPU, naming the
limit and a cheaper choice.

Measured on the 2-core development CPU (numpy, one thread): one float64 ``eigh`` at ``n = 2048``
takes about 3.5 s and the iteration needs about 280 steps, so ``n = 2048`` takes about 16 minutes;
the cost grows as ``n³`` per step.

Under ``epochs`` with ``k ≥ 2`` participations ``dense`` and ``dpmf_plus`` solve the multi-epoch dual
instead (:mod:`fedsim.privacy.mechanisms.multi_epoch`): each L-BFGS evaluation is one ``eigh`` and
four ``n×n`` products, measured at 2–3.5 ``eigh``-times (n = 512–1024), and the solve took 18–106
evaluations for the prefix workload (n = 64–1024, k = 2–16) and 89–970 for the momentum workload
(n = 64–512; the most at k = 16). The estimate takes 3.5 ``eigh``-times per evaluation and 150
evaluations (prefix) or 1000 (momentum). Under ``min_sep`` they run the banded optimiser, which
needs no eigendecomposition (the single-participation estimate is an upper bound).
"""

from __future__ import annotations

from fedsim.errors import FedsimError

#: ``n×n`` float64 matrices alive at once while planning (A, C, C⁻¹, B and temporaries).
MATRIX_COPIES = 8
#: Seconds of one float64 ``eigh`` at n = 2048 on the reference CPU, and the iterations needed.
EIGH_SECONDS_2048 = 3.5
DENSE_ITERATIONS = 300
#: The multi-epoch (``epochs``) solve: ``eigh``-times per evaluation, evaluations per workload.
EIGHS_PER_EVALUATION = 3.5
MULTI_EPOCH_EVALUATIONS = {"prefix": 150, "momentum": 1000}
#: Longest CPU factorization fedsim starts without a GPU (seconds).
MAX_CPU_SECONDS = 2 * 3600.0


def available_memory_bytes() -> int:
    """``MemAvailable`` from ``/proc/meminfo`` (Linux), else a conservative 4 GiB."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30


def factorization_memory_bytes(n: int) -> int:
    """Bytes of the ``n×n`` float64 matrices a plan holds at once."""
    return MATRIX_COPIES * 8 * int(n) * int(n)


def dense_cpu_seconds(n: int, multi_epoch_workload: str | None = None) -> float:
    """Estimated CPU seconds of the ``dense``/``dpmf_plus`` optimiser: the single-participation
    fixed point, or with ``multi_epoch_workload`` (``prefix``/``momentum``) the ``epochs`` solve."""
    steps = float(DENSE_ITERATIONS)
    if multi_epoch_workload is not None:
        steps = EIGHS_PER_EVALUATION * MULTI_EPOCH_EVALUATIONS.get(multi_epoch_workload, 1000)
    return steps * EIGH_SECONDS_2048 * (int(n) / 2048.0) ** 3


def check_factorization_fits(
    mechanism: str, rounds: int, device: str | None = None, multi_epoch_workload: str | None = None
) -> None:
    """Raise :class:`FedsimError` if factorizing ``rounds`` rounds with ``mechanism`` cannot fit
    this machine (memory) or would exceed :data:`MAX_CPU_SECONDS` on the CPU.
    ``multi_epoch_workload``: the workload's name when ``dense``/``dpmf_plus`` will run the
    ``epochs`` multi-epoch solve (default None: the single-participation fixed point)."""
    need, have = factorization_memory_bytes(rounds), available_memory_bytes()
    if need > have:
        cheaper = (
            "" if mechanism in ("blt", "banded") else "; BLT (privacy.mechanism = 'blt') and banded MF need the least, "
        )
        raise FedsimError(
            f"factorizing n = {rounds:,} rounds needs about {need / 2**30:,.1f} GiB for its {rounds:,}×{rounds:,} "
            f"matrices, more than the {have / 2**30:,.1f} GiB available here{cheaper}"
            f"{'' if cheaper else '; '}lower rounds (n), or split the run"
        )
    if mechanism in ("dense", "dpmf_plus") and (device is None or device == "cpu"):
        secs = dense_cpu_seconds(rounds, multi_epoch_workload)
        if secs > MAX_CPU_SECONDS:
            raise FedsimError(
                f"the {mechanism} optimiser at n = {rounds:,} would take about {secs / 3600:,.1f} h on this CPU "
                f"(limit {MAX_CPU_SECONDS / 3600:.0f} h): run it on a GPU (--device cuda / "
                f"privacy.factorize_device = 'cuda'), or use privacy.mechanism = 'blt' or 'banded', which "
                f"factorize in seconds"
            )
