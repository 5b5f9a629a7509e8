"""Assign a round's users to workers by expected cost, greedily (longest first).

Each user's cost is its expected local work (samples × epochs); users are taken
in decreasing cost and each goes to the currently least-loaded worker, so no
worker waits long on another. Deterministic: ties break by worker index.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np


def assign_users(users: Sequence[int], costs: Sequence[float] | np.ndarray, num_workers: int) -> list[list[int]]:
    """Split ``users`` into ``num_workers`` lists (each sorted) balancing total cost.

    Parameters
    ----------
    users : user indices of the round.
    costs : cost of each user, indexed by user index (``costs[u]``).
    num_workers : number of workers (≥ 1).
    """
    if num_workers < 1:
        raise ValueError("num_workers must be ≥ 1")
    heap = [(0.0, w) for w in range(num_workers)]
    shares: list[list[int]] = [[] for _ in range(num_workers)]
    for u in sorted(users, key=lambda u: (-float(costs[u]), u)):
        load, w = heapq.heappop(heap)
        shares[w].append(int(u))
        heapq.heappush(heap, (load + float(costs[u]), w))
    return [sorted(s) for s in shares]
