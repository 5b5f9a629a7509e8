"""What a mechanism's noise will cost a run, said before round 1 (`fedsim privacy --dim D`).

The estimate runs the mechanism's own noise stream, so it holds for a plugin's stream too:

- memory: the stream is stepped for a few rounds at a small dimension and its `state_dict()`
  tensors are measured; the state is linear in the model's dimension `d` (every shipped stream
  holds whole rows of `d`), so it is scaled to `d`. A dense `C⁻¹` (dense, DP-MF+, tree, sqrt
  noise) keeps `ξ` rows up to `privacy.noise_memory_mib`, then a noise table on disk (`n·d·4`
  bytes) built at round 1;
- CPU: a row's time is measured at `d₀ = 2¹⁸` coordinates on this machine (the first row, which
  pays one-off allocations, left out) and scaled linearly to `d` (drawing and combining rows is linear in `d`); a table's build is estimated at the
  rates the run's header uses (about 30 ns a Gaussian, 20 GFLOP/s for the float64 product).

These are estimates on this machine, not guarantees; docs/benchmarks.md ("Scale") has the
measured rows they were checked against.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedsim.privacy.stream import NoiseStream

#: Coordinates at which a row's CPU time is measured.
PROBE_DIM = 1 << 18
#: Rounds stepped for the measurements (fewer when the run is shorter).
PROBE_ROUNDS = 6


def _state_bytes(stream: NoiseStream) -> int:
    import torch

    def walk(x: Any) -> int:
        if isinstance(x, torch.Tensor):
            return x.numel() * x.element_size()
        if isinstance(x, dict):
            return sum(walk(v) for v in x.values())
        if isinstance(x, (list, tuple)):
            return sum(walk(v) for v in x)
        return 0

    return walk(stream.state_dict())


def _stepped(make_stream: Any, dim: int, rounds: int) -> tuple[NoiseStream, list[float]]:
    """A fresh stream bound to `dim`, stepped `rounds` times, and each row's CPU seconds."""
    import torch

    from fedsim.privacy.rng import PrivacyKey, gaussians

    stream = make_stream()
    stream.bind(dim, torch.device("cpu"))
    key = PrivacyKey.from_seed(0).derive("cost-probe")
    seconds = []
    for t in range(rounds):
        start = time.process_time()
        stream.step(t, lambda j: gaussians(key.derive("row", j), dim))
        seconds.append(time.process_time() - start)
    return stream, seconds


def _linear_fit(seconds: list[float]) -> tuple[float, float]:
    """`a`, `b` of row t's time `a + b·t` (least squares; `b ≥ 0`)."""
    import numpy as np

    t = np.arange(len(seconds), dtype=np.float64)
    if len(seconds) < 2:
        return float(seconds[0]), 0.0
    b, a = np.polyfit(t, np.asarray(seconds), 1)
    b = max(float(b), 0.0)
    return max(float(np.mean(seconds) - b * t.mean()), 0.0), b


def noise_cost(make_stream: Any, rounds: int, dim: int, memory_budget: int, noise_table: bool = True) -> dict[str, Any]:
    """The noise stream's memory, disk and CPU for a run of `rounds` rounds at dimension `dim`.

    Parameters
    ----------
    make_stream : callable
        Returns a fresh, unbound noise stream of the run's mechanism (`mech.stream(plan)`).
    rounds : int
        Rounds of the run (`n`).
    dim : int
        The model's number of parameters (`d`).
    memory_budget : int
        `privacy.noise_memory_mib` in bytes: the history a dense `C⁻¹` may keep in memory.
    noise_table : bool
        `privacy.noise_table`: past the budget, a table on disk (True, the default) or a redraw
        of every earlier row each round (False).

    Returns
    -------
    dict
        `dim`; `state_bytes` (held in memory at the run's end); `disk_bytes` (a noise table,
        deleted when the run ends); `row_cpu_ms` (a round's noise, estimated); `run_cpu_s` (all
        rounds' noise, including a table's build); `table_build_cpu_s` (0 without a table).
    """
    from fedsim.privacy.noise import MatrixStream

    k = max(1, min(PROBE_ROUNDS, int(rounds)))
    small = 64
    probe, _ = _stepped(make_stream, small, k)
    # one row more than probed, within the run's rounds: the first row pays one-off allocations and
    # is left out, unless it is the run's only row
    steps = min(k + 1, max(int(rounds), 1))
    _, seconds = _stepped(make_stream, PROBE_DIM, steps)
    first = 1 if steps > 1 else 0
    seconds = seconds[first:]
    scale = dim / PROBE_DIM
    out: dict[str, Any] = {"dim": int(dim), "disk_bytes": 0, "table_build_cpu_s": 0.0}
    if isinstance(probe, MatrixStream):
        n, m = probe.noising.shape
        a, b = _linear_fit(seconds)  # row t combines t + 1 rows of ξ: linear in t (t = first … steps - 1)
        a = max(a - first * b, 0.0)
        history = m * dim * 4
        if history <= memory_budget or not noise_table:
            # every ξ row kept in memory (or, past the budget without a table, redrawn)
            redraw = 0.0 if history <= memory_budget else a
            run = scale * sum(a + (b + redraw) * t for t in range(rounds))
            out.update(state_bytes=min(history, memory_budget) if history <= memory_budget else 0, run_cpu_s=run)
        else:
            flops = (1.0 if n == m else 2.0) * n * m * dim
            build = m * dim * 30e-9 + flops / 20e9
            out.update(state_bytes=memory_budget, disk_bytes=max(n, m) * dim * 4, table_build_cpu_s=build)
            out["run_cpu_s"] = build + rounds * dim * 4 / 1e9  # then a row is read: about a GB/s
        out["row_cpu_ms"] = 1e3 * out["run_cpu_s"] / max(rounds, 1)
        return out
    row = scale * sorted(seconds)[len(seconds) // 2]
    out["state_bytes"] = int(round(_state_bytes(probe) / small * dim))
    out["row_cpu_ms"] = 1e3 * row
    out["run_cpu_s"] = row * rounds
    return out


def describe_cost(mechanism: str, rounds: int, cost: dict[str, Any]) -> str:
    """`noise_cost`'s estimate in one line (`fedsim privacy --dim` and a run's header).

    Parameters
    ----------
    mechanism : str
        The mechanism's name.
    rounds : int
        Rounds of the run.
    cost : dict
        What `noise_cost` returned, with `fits_memory`.
    """
    line = (
        f"{mechanism} noise at d = {cost['dim']:,}: {_mib(cost['state_bytes'])} of state in memory, about "
        f"{cost['row_cpu_ms']:,.3g} ms of CPU a round ({_cpu(cost['run_cpu_s'])} over {rounds} rounds)"
    )
    if cost["disk_bytes"]:
        line += (
            f", a {cost['disk_bytes'] / 1e9:,.1f} GB noise table on disk (built at round 1, about "
            f"{_cpu(cost['table_build_cpu_s'])}; deleted when the run ends)"
        )
    if not cost["fits_memory"]:
        line += "; its state does NOT fit this machine's available memory: use privacy.mechanism = 'blt' or 'banded'"
    return line + " (estimates on this machine)"


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 10 * 2**20 else f"{n / 2**20:.2g} MiB"


def _cpu(seconds: float) -> str:
    return f"{seconds / 60:,.1f} CPU-minutes" if seconds >= 120 else f"{seconds:.2g} CPU-seconds"
