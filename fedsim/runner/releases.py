"""The run's append-only record of what left the server and the silos: ``checkpoint/releases.jsonl``.

Two kinds of line, each written and flushed to disk *before* the thing it records can happen:

- ``{"event": "train", "round": r, "silos": [...]}`` — example-level DP (``privacy.unit =
  "example"``): the silos asked to run DP-SGD in round ``r``, written before the train messages
  are pushed. A silo's work leaves the silo with its reply, so every training the server can
  receive (in a round that completes, one stopped by too few valid replies, one abandoned by a
  stop or one cut by a crash) is in the record. A silo that fails before it trains is counted
  too: the record errs on the side of more spent budget.
- ``{"event": "model", "round": r, "sha256": h}`` — the model ``x_r`` after round ``r``'s noise,
  written before ``x_r`` is sent anywhere (evaluation, the next round's train messages, the
  metrics row).

A resume restores every other piece of state from the checkpoint, which is older than the last
round; this file is never truncated or rewritten. The silo ledger is rebuilt from its ``train``
lines (:meth:`ReleaseLog.silo_trainings`), so no resume can roll back a silo's spent budget; a
re-run of a round whose model was already sent must give the same bits
(:meth:`ReleaseLog.published`), or the run stops before sending it again.

The file lives in the owner-only ``checkpoint/`` folder: its ``train`` lines say which silos were
sampled in which round (a side statistic outside ε, like the checkpoint's sampler key).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from fedsim.errors import FedsimError, writing

#: The file's name inside the run folder's ``checkpoint/`` folder.
RELEASES_NAME = "releases.jsonl"


class ReleaseLog:
    """Append-only JSON lines under ``folder`` (created owner-only when missing).

    Parameters
    ----------
    folder : the run folder's ``checkpoint/`` folder.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / RELEASES_NAME
        self._events = self._read()
        #: round → SHA-256 of the model sent, kept as events are read and appended (looked up every round)
        self._models = {int(e["round"]): str(e["sha256"]) for e in self._events if e.get("event") == "model"}

    def _read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        events = []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                if i == len(lines) - 1:  # a write cut by a kill: the event it began never happened
                    break
                raise FedsimError(f"{self.path}: line {i + 1} is not JSON; the record was altered") from None
        return events

    def _append(self, event: dict[str, Any]) -> None:
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        line = json.dumps(event, separators=(",", ":")) + "\n"
        with writing(self.path):
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        self._events.append(event)
        if event["event"] == "model":
            self._models[int(event["round"])] = str(event["sha256"])

    def record_training(self, round_number: int, silos: list[int]) -> None:
        """Round ``round_number`` (1-based) asks ``silos`` to train; call before the messages go."""
        self._append({"event": "train", "round": int(round_number), "silos": sorted(int(s) for s in silos)})

    def record_model(self, round_number: int, sha256: str) -> None:
        """The model after round ``round_number`` is about to be sent; call before it goes."""
        self._append({"event": "model", "round": int(round_number), "sha256": str(sha256)})

    def silo_trainings(self) -> Counter[int]:
        """Every silo's DP-SGD trainings so far (participations), over every ``train`` line."""
        counts: Counter[int] = Counter()
        for e in self._events:
            if e.get("event") == "train":
                counts.update(int(s) for s in e["silos"])
        return counts

    def sent(self, round_number: int) -> str | None:
        """The SHA-256 recorded for round ``round_number``'s model, or None."""
        return self._models.get(int(round_number))

    def published(self) -> dict[int, str]:
        """``{round: sha256}`` of every model recorded as sent."""
        return dict(self._models)
