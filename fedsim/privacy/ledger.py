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

from fedsim.errors import FedsimError
from fedsim.privacy.accounting import AccountingSpec, EpsilonCurve, epsilon


def _json_float(x: float | None) -> float | str | None:
    return "inf" if x is not None and math.isinf(x) else x


class Ledger:
    """Per-round privacy record.

    Parameters
    ----------
    spec : the accounting spec of the run (fixed for its whole length).
    planned_rounds : rounds the run was configured for (for the planned final ε).
    budget_split : how ``z`` is shared when a second query (adaptive clipping's count)
        spends part of it: ``{"update_noise_multiplier", "count_stddev", ...}``; recorded so
        that ``z`` can be recomputed from its parts (:func:`check_budget_split`).
    notes : caveats that must travel with every ε of this run (e.g. the experimental label
        of server-side error feedback).
    """

    def __init__(
        self,
        spec: AccountingSpec,
        planned_rounds: int,
        budget_split: dict[str, Any] | None = None,
        notes: list[str] | None = None,
        account_every: int = 1,
        side_statistics: bool = True,
    ) -> None:
        self.spec = spec
        #: record the realised cohort size per round and each silo's participations (side
        #: statistics, outside ε); False keeps only what recomputes ε.
        self.side_statistics = bool(side_statistics)
        #: ε is computed after rounds ``t`` with ``t % account_every == 0`` and after the last
        #: planned round; other entries carry ``epsilon: None``.
        self.account_every = int(account_every)
        self.notes = list(notes or [])
        self.planned_rounds = planned_rounds
        self.budget_split = budget_split
        #: example-level accounting of the silos (``privacy.unit = "example"``), a
        #: :class:`fedsim.training.example_dp.SiloLedger`; None otherwise.
        self.silo: Any = None
        self.entries: list[dict[str, Any]] = []
        self._curve = EpsilonCurve(spec)

    @property
    def rounds_recorded(self) -> int:
        return len(self.entries)

    @property
    def epsilon(self) -> float:
        """ε after the last recorded round (0 before any round), computed if that entry skipped it."""
        if not self.entries:
            return 0.0
        if self.entries[-1]["epsilon"] is None:
            self.entries[-1]["epsilon"] = self._curve(len(self.entries))
        return float(self.entries[-1]["epsilon"])

    def next_accounted(self) -> int | None:
        """The next round (1-based, after those recorded) whose ε is computed when it is
        recorded (``account_every``, the last planned round); None past the planned rounds."""
        t = len(self.entries) + 1
        if t > self.planned_rounds:
            return None
        return min(-(-t // self.account_every) * self.account_every, self.planned_rounds)

    def prefetch(self) -> None:
        """Start computing ε of :meth:`next_accounted` in the background (a PLD composition,
        :meth:`fedsim.privacy.accounting.EpsilonCurve.prefetch`): the same float, off the round's
        critical path."""
        t = self.next_accounted()
        if t is not None:
            self._curve.prefetch(t)

    def record_round(self, round_index: int, realized_cohort: int, clip_norm: float | None = None) -> float | None:
        """Record round ``round_index`` (0-based) and return ε after it (None when
        ``account_every`` skips this round).

        ``realized_cohort`` is stored for the record only: with a fixed
        denominator ``K̄`` the realised size does not enter the accounting.
        ``clip_norm`` (the round's ``c_t``) is recorded when clipping is adaptive.
        """
        if round_index != len(self.entries):
            raise RuntimeError(f"ledger expects round {len(self.entries)}, got {round_index}")
        t = round_index + 1
        due = t % self.account_every == 0 or t >= self.planned_rounds
        eps = self._curve(t) if due else None
        entry: dict[str, Any] = {"round": round_index + 1, "epsilon": eps}
        if self.side_statistics:
            entry["cohort"] = int(realized_cohort)
        if self.budget_split is not None and clip_norm is not None:
            entry["clip_norm"] = float(clip_norm)
        if self.silo is not None and self.side_statistics:
            entry["example_epsilon_max"] = self.silo.max_epsilon
        self.entries.append(entry)
        self.prefetch()  # the next accounted round's ε, while that round trains
        return eps

    def to_json(self, settle: bool = False) -> dict[str, Any]:
        """The ledger as ``ledger.json`` holds it.

        ``settle``: also give ε after the last recorded round when ``account_every`` skipped it
        (what a stopped run has spent so far). Only the returned copy carries it, so the state a
        checkpoint holds, and a resumed run's ledger, stay those of an uninterrupted run.
        Default False."""
        entries = [dict(e, epsilon=_json_float(e["epsilon"])) for e in self.entries]
        if settle and entries and entries[-1]["epsilon"] is None:
            entries[-1]["epsilon"] = _json_float(self._curve(len(entries)))
        return {
            "format": "fedsim.ledger/1",
            "spec": self.spec.to_dict(),
            "planned_rounds": self.planned_rounds,
            "dp_event": str(self.spec.round_event()),
            "composition": self.spec.describe_events(),
            "budget_split": self.budget_split,
            "notes": self.notes,
            "example_level": None if self.silo is None else self.silo.to_json(per_silo=self.side_statistics),
            "entries": entries,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "planned_rounds": self.planned_rounds,
            "entries": [dict(e) for e in self.entries],
            "silo": None if self.silo is None else self.silo.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.planned_rounds = int(state["planned_rounds"])
        self.entries = [dict(e) for e in state["entries"]]
        if self.silo is not None:
            self.silo.load_state_dict(state["silo"])


def check_budget_split(ledger_json: dict[str, Any]) -> float | None:
    """Recompute the accounted ``z`` from a ledger's budget split (None if it has none):
    ``(z_Δ^{−2} + k·(2σ_b)^{−2})^{−1/2}``, to compare with ``spec.noise_multiplier``."""
    split = ledger_json.get("budget_split")
    if not split:
        return None
    from fedsim.privacy.adaptive_clip import combined_noise_multiplier

    return combined_noise_multiplier(
        split["update_noise_multiplier"], split["count_stddev"], split["count_releases_per_user"]
    )


#: What a ledger states beside its spec's fields, each derived from them: a file whose statement
#: differs from what its fields give (an edited relation or accountant) is refused.
DERIVED = ("sampling_rate", "effective_accountant", "neighboring_relation", "sensitivity_in_c")


def spec_from_ledger(ledger_json: dict[str, Any]) -> AccountingSpec:
    """The :class:`AccountingSpec` stored in a ``ledger.json``.

    Raises :class:`FedsimError` when what the file states beside the fields (the neighbouring
    relation, the accountant, the sampling rate, the sensitivity, the DP event) is not what the
    fields give: its ε would then be read under a guarantee it was not computed for."""
    names = {f.name for f in fields(AccountingSpec)}
    stored = ledger_json["spec"]
    spec = AccountingSpec(**{k: v for k, v in stored.items() if k in names})
    derived = spec.to_dict()
    for key in DERIVED:
        if key in stored and stored[key] != derived[key]:
            raise FedsimError(
                f"ledger.json states {key} = {stored[key]!r}, but its spec gives {derived[key]!r}: "
                "the file was edited or is not fedsim's; recompute from an unedited ledger"
            )
    if "dp_event" in ledger_json and ledger_json["dp_event"] != str(spec.round_event()):
        raise FedsimError(
            "ledger.json's dp_event is not the event its spec gives: the file was edited or is not "
            "fedsim's; recompute from an unedited ledger"
        )
    return spec


def recompute_epsilon(ledger_json: dict[str, Any], rounds: int | None = None) -> float:
    """ε after ``rounds`` (default: the last recorded round), recomputed from the
    ledger's spec with a fresh dp-accounting accountant."""
    spec = spec_from_ledger(ledger_json)
    t = len(ledger_json["entries"]) if rounds is None else rounds
    return epsilon(spec, t)
