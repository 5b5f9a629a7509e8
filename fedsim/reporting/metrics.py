"""Run-folder outputs written while a run goes: ``metrics.jsonl`` and the progress line."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, TextIO

from fedsim.errors import writing

#: Per-round metrics computed from users' data outside the DP mechanism: ε does not cover them.
SIDE_STATISTICS = (
    "train_loss",
    "cohort_size",
    "accepted_updates",
    "dropped_updates",
    "dropped_replies",
    "drop_reasons",
    "server_reclipped",
    "clipped_fraction",
    "train_examples",
    "failed_users",
    "nonfinite_users",
    "example_epsilon_max",
)

#: What every output says about them.
SIDE_STATISTICS_NOTE = (
    "side statistics (realised cohort sizes, accepted/dropped counts, clipped fraction, "
    "train loss, evaluation on users' held-out data) are computed from users' data outside "
    "the DP mechanism and are not covered by ε; privacy.publish_side_statistics = false "
    "drops them"
)


def is_side_statistic(key: str) -> bool:
    """Whether metrics key ``key`` is a side statistic (:data:`SIDE_STATISTICS` or ``eval_*``)."""
    return key in SIDE_STATISTICS or key.startswith("eval_")


def public_row(row: dict[str, Any], publish_side_statistics: bool) -> dict[str, Any]:
    """The metrics row as published: unchanged, or without its side statistics."""
    if publish_side_statistics:
        return row
    return {k: v for k, v in row.items() if not is_side_statistic(k)}


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    return x


class MetricsWriter:
    """Appends one JSON object per round to ``metrics.jsonl`` (flushed every line)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        with writing(self.path):  # a full disk names the file
            self._f.write(json.dumps(_jsonable(row), sort_keys=False) + "\n")
            self._f.flush()

    def close(self) -> None:
        self._f.close()


def _fmt(x: Any, spec: str) -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "∞"
    return format(x, spec)


class ProgressLine:
    """A live one-line status: round, train loss, eval accuracy, ε so far.

    On a terminal the line is redrawn in place; otherwise one line per round is printed.
    """

    def __init__(
        self, total_rounds: int, stream: TextIO | None = None, enabled: bool = True, relation: str = ""
    ) -> None:
        self.total = total_rounds
        #: the neighbouring relation printed next to ε (e.g. ``add/remove one user``)
        self.relation = relation
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.last_acc: float | None = None
        self._t0: float | None = None  # wall clock at the first update, and its round
        self._r0 = 0

    def update(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if row.get("eval_accuracy") is not None:
            self.last_acc = row["eval_accuracy"]
        acc = None if self.last_acc is None else 100 * self.last_acc
        stats = (
            ""
            if "train_loss" not in row
            else f"train loss {_fmt(row.get('train_loss'), '.4f')}  eval acc {_fmt(acc, '.2f')}%  "
        )
        import time

        now = time.monotonic()
        if self._t0 is None:
            self._t0, self._r0 = now - float(row.get("seconds", 0) or 0), row["round"] - 1
        done = row["round"] - self._r0
        rate = done / max(now - self._t0, 1e-9)
        left = (self.total - row["round"]) / rate if rate > 0 else 0.0
        from fedsim.privacy.display import format_epsilon  # rounded up; imported late: this module stays light

        text = (
            f"round {row['round']:>{len(str(self.total))}}/{self.total}  {stats}"
            f"ε {format_epsilon(row.get('epsilon'))}{f' ({self.relation})' if self.relation else ''}  "
            f"({row.get('seconds', 0):.1f} s, {rate:.2f} rounds/s, ETA {int(left) // 60}m{int(left) % 60:02d}s)"
        )
        if self.tty:
            self.stream.write("\r\033[K" + text)
            if row["round"] >= self.total:
                self.stream.write("\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def notice(self, text: str) -> None:
        """Print ``text`` on its own line (below the live line on a terminal)."""
        if not self.enabled:
            return
        self.stream.write(("\n" if self.tty else "") + text + "\n")
        self.stream.flush()
