"""The privacy ledger: what was spent, round by round, reproducible from its own contents.

``ledger.json`` holds the accounting spec (mechanism, scheme, N, K̄, z, δ,
accountant, adjacency) and one entry per completed round with ε so far. Every ε
in it can be recomputed from the spec alone with :func:`recompute_epsilon`, which
builds the dp-accounting events afresh — that is the test of every printed number.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

from fedsim.privacy.accounting import AccountingSpec, EpsilonCurve, epsilon


def _json_float(x: float) -> float | str:
    return "inf" if math.isinf(x) else x


class Ledger:
    """Per-round privacy record.

    Parameters
    ----------
    spec : the accounting spec of the run (fixed for its whole length).
    planned_rounds : rounds the run was configured for (for the planned final ε).
    """

    def __init__(self, spec: AccountingSpec, planned_rounds: int) -> None:
        self.spec = spec
        self.planned_rounds = planned_rounds
        self.entries: list[dict[str, Any]] = []
        self._curve = EpsilonCurve(spec)

    @property
    def rounds_recorded(self) -> int:
        return len(self.entries)

    @property
    def epsilon(self) -> float:
        """ε after the last recorded round (0 before any round)."""
        return self.entries[-1]["epsilon"] if self.entries else 0.0

    def record_round(self, round_index: int, realized_cohort: int) -> float:
        """Record round ``round_index`` (0-based) and return ε after it.

        ``realized_cohort`` is stored for the record only: with a fixed
        denominator ``K̄`` the realised size does not enter the accounting.
        """
        if round_index != len(self.entries):
            raise RuntimeError(f"ledger expects round {len(self.entries)}, got {round_index}")
        eps = self._curve(round_index + 1)
        self.entries.append({"round": round_index + 1, "epsilon": eps, "cohort": int(realized_cohort)})
        return eps

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "fedsim.ledger/1",
            "spec": self.spec.to_dict(),
            "planned_rounds": self.planned_rounds,
            "dp_event": str(self.spec.round_event()),
            "composition": self.spec.describe_events(),
            "entries": [dict(e, epsilon=_json_float(e["epsilon"])) for e in self.entries],
        }

    def state_dict(self) -> dict[str, Any]:
        return {"planned_rounds": self.planned_rounds, "entries": [dict(e) for e in self.entries]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.planned_rounds = int(state["planned_rounds"])
        self.entries = [dict(e) for e in state["entries"]]


def spec_from_ledger(ledger_json: dict[str, Any]) -> AccountingSpec:
    """The :class:`AccountingSpec` stored in a ``ledger.json``."""
    names = {f.name for f in fields(AccountingSpec)}
    return AccountingSpec(**{k: v for k, v in ledger_json["spec"].items() if k in names})


def recompute_epsilon(ledger_json: dict[str, Any], rounds: int | None = None) -> float:
    """ε after ``rounds`` (default: the last recorded round), recomputed from the
    ledger's spec with a fresh dp-accounting accountant."""
    spec = spec_from_ledger(ledger_json)
    t = len(ledger_json["entries"]) if rounds is None else rounds
    return epsilon(spec, t)
