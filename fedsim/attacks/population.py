"""The population an audit trains on: the dataset with canary users added and held-out users
removed, described so that every worker rebuilds the same view.

An :class:`AuditView` is what the server and the workers share (it travels in the workers' task
as JSON): the canary set (or None) and the users held out of training. :meth:`AuditView.apply`
turns the loaded dataset into the trained population — deterministically, so the server's
sampler and accountant and every worker see the same users in the same order.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from fedsim.attacks.canaries import CanarySet, with_canary_users
from fedsim.attacks.views import FederatedView, without_users
from fedsim.data import FederatedData, Population


@dataclass(frozen=True)
class AuditView:
    """How an audit changes the trained population.

    Parameters
    ----------
    canaries : the secret-sharer canary users to add (their donors are hidden), or None.
    held_out : indices (in the loaded dataset) of the users never trained on (user inference's
        held-out users). Default none.
    """

    canaries: CanarySet | None = None
    held_out: tuple[int, ...] = ()

    def apply(self, data: FederatedData) -> FederatedView:
        """The trained population: ``data`` without the held-out users (and the canaries' donors),
        with the canary users appended (ids after every real user; no test samples)."""
        if self.canaries is not None:
            return with_canary_users(data, self.canaries, exclude=self.held_out)
        return without_users(data, self.held_out)

    def to_json(self) -> str:
        return json.dumps(
            {
                "canaries": None if self.canaries is None else json.loads(self.canaries.to_json()),
                "held_out": list(self.held_out),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> AuditView:
        raw = json.loads(text)
        canaries = None if raw["canaries"] is None else CanarySet.from_json(json.dumps(raw["canaries"]))
        return cls(canaries, tuple(int(u) for u in raw["held_out"]))


def ordinary_users(data: Population) -> Sequence[int]:
    """The users whose data may enter evaluation numbers: all of them, or a view's real users
    (never the audit's canary users)."""
    if isinstance(data, FederatedView):
        return data.ordinary_users()
    return range(data.population)
