"""``tree``: binary-tree aggregation (Honaker 2015; Kairouz et al. 2021, "Practical and private
(deep) learning without sampling or shuffling") for the prefix sum: ``C = H``, the
``(2n−1)×n`` node-incidence matrix, with the ``online`` or ``full`` estimator.

Decisions where the specification is silent:

- Tree nodes are ordered by completion time: node ``[a, b]`` (leaves ``a..b``) comes after
  every node that ends before ``b``, and nodes ending at ``b`` go from the leaf upwards
  (see :func:`tree_nodes`). The ``online`` decoder of round ``t`` then reads only nodes
  that are complete by round ``t``.
- The ``full`` estimator ``B = S·H⁺`` reads nodes that end after ``t`` (it is the offline
  least-squares estimate). This is still private: the per-round noise ``n = S⁻¹·B·Z =
  H⁺·Z`` is drawn in advance, independently of the data, and is distributed as
  ``N(0, (HᵀH)⁻¹)``, i.e. exactly as ``C̃⁻¹·Z`` for the lower-triangular ``C̃`` with
  ``C̃ᵀC̃ = HᵀH``, whose column norms equal ``H``'s. Its privacy is that of ``C̃`` under
  adaptive streams.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from fedsim.errors import FedsimError
from fedsim.privacy.factorizations import Factorization
from fedsim.privacy.mechanisms.base import DenseStrategy, Mechanism, MechanismOptions, MFOptions, Strategy
from fedsim.privacy.mechanisms.registry import register
from fedsim.privacy.participation import ParticipationScheme
from fedsim.privacy.workloads import prefix_sum

TREE_ESTIMATORS = ("online", "full")


def _is_power_of_two(n: int) -> bool:
    return n >= 1 and (n & (n - 1)) == 0


def tree_nodes(n: int) -> list[tuple[int, int]]:
    """Nodes of the complete binary tree over ``n`` leaves, as inclusive leaf ranges.

    Ordered by completion time: by last leaf, then from the leaf upwards, so row ``i`` of
    :func:`tree`'s ``H`` is available once round ``nodes[i][1]`` has finished.

    Parameters
    ----------
    n : int
        Number of leaves (rounds); a power of two.

    Returns
    -------
    list of (int, int)
        ``2n − 1`` pairs ``(first_leaf, last_leaf)``.
    """
    if isinstance(n, bool) or int(n) != n or not _is_power_of_two(int(n)):
        raise FedsimError(
            f"binary-tree aggregation needs the number of rounds n to be a power of two, "
            f"got n={n!r}; change the number of rounds (e.g. to a power of two) or use "
            f"mechanism 'sqrt' or 'dense'"
        )
    n = int(n)
    nodes: list[tuple[int, int]] = []
    for end in range(n):
        size = 1
        while size <= n and (end + 1) % size == 0:
            nodes.append((end - size + 1, end))
            size *= 2
    return nodes


def tree(n: int, estimator: str = "online", A: np.ndarray | None = None) -> Factorization:
    """Binary-tree aggregation (Honaker 2015; Kairouz et al. 2021) for the prefix sum.

    ``C = H`` is the ``(2n−1)×n`` node-incidence matrix: each node is the sum of its
    leaves (row order of :func:`tree_nodes`). Every leaf lies in ``log₂ n + 1`` nodes, so
    the single-participation sensitivity is ``√(log₂ n + 1)``.

    Parameters
    ----------
    n : int
        Number of rounds; a power of two.
    estimator : {"online", "full"}, optional
        ``"online"`` (default): prefix sum ``t`` is the sum of the dyadic nodes that tile
        ``[0, t]`` (rows of ``B`` are 0/1, at most ``log₂ n + 1`` ones, causal).
        ``"full"``: the least-squares estimator ``B = S·H⁺`` (smallest error per release).
    A : np.ndarray or None, optional
        The workload; default ``None`` means the prefix sum. Only the prefix sum is
        supported: any other matrix is refused.
    """
    nodes = tree_nodes(n)
    n = int(n)
    if estimator not in TREE_ESTIMATORS:
        raise FedsimError(f"unknown tree estimator {estimator!r}; choose one of {', '.join(TREE_ESTIMATORS)}")
    S = prefix_sum(n)
    if A is not None:
        A = np.asarray(A, dtype=np.float64)
        if A.shape != (n, n) or not np.array_equal(A, S):
            raise FedsimError(
                "mechanism 'tree' only supports the prefix-sum workload (plain SGD); use "
                "workload 'prefix', or a mechanism such as 'dense' or 'sqrt' for momentum "
                "and learning-rate schedules"
            )
    m = len(nodes)
    H = np.zeros((m, n))
    index = {}
    for i, (a, b) in enumerate(nodes):
        H[i, a : b + 1] = 1.0
        index[(a, b)] = i
    if estimator == "online":
        B = np.zeros((n, m))
        for t in range(n):
            length, start = t + 1, 0
            for k in range(n.bit_length() - 1, -1, -1):
                size = 1 << k
                if length & size:
                    B[t, index[(start, start + size - 1)]] = 1.0
                    start += size
    else:
        H_pinv, *_ = np.linalg.lstsq(H, np.eye(m), rcond=None)
        B = S @ H_pinv
    return Factorization("tree", S, H, B, {"estimator": estimator, "nodes": m})


class TreeOptions(MFOptions):
    """``privacy.mechanism = "tree"``.

    Parameters
    ----------
    tree_estimator : ``online`` (each prefix sum from its dyadic nodes; default) or ``full``
        (the least-squares estimator).
    """

    mechanism: Literal["tree"] = "tree"
    tree_estimator: Literal["online", "full"] = Field(
        default="online", description="online (dyadic nodes) or full (least squares)"
    )


@register
class Tree(Mechanism):
    name = "tree"
    options = TreeOptions
    summary = "binary-tree aggregation (online or least-squares estimator); n a power of two"

    def strategy(self, opts: MechanismOptions, A: np.ndarray, scheme: ParticipationScheme) -> Strategy:
        assert isinstance(opts, TreeOptions)
        return DenseStrategy.of(tree(A.shape[0], estimator=opts.tree_estimator, A=A))
