"""Named single-thread workers for work that overlaps a round's training: the next noise row
(:meth:`fedsim.privacy.noise.NoiseMechanism.prefetch`) and the next accounted ε
(:meth:`fedsim.privacy.accounting.EpsilonCurve.prefetch`). Each result is a pure function of its
inputs, so computing it ahead changes no number."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

_WORKERS: dict[str, ThreadPoolExecutor] = {}


def worker(name: str) -> ThreadPoolExecutor:
    """The one background thread called `name` (made on first use, kept for the process).

    Parameters
    ----------
    name : the thread's name prefix, e.g. `fedsim-noise`.
    """
    if name not in _WORKERS:
        _WORKERS[name] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    return _WORKERS[name]
