"""Stopping a run on SIGINT (Ctrl-C) or SIGTERM without losing it.

- The **first** signal sets :attr:`StopRequest.event`. The strategy polls it while it waits for
  the workers' replies and between rounds; the round in flight is abandoned *before*
  aggregation, so no noise is drawn for it and the privacy ledger does not move. The runner then
  writes the checkpoint of the last completed round, shuts Ray (or the in-process workers, or
  the deployment's nodes) down, kills whatever process of the run is left, and raises
  :class:`RunInterrupted`; the CLI prints one line saying how to resume and exits with
  ``128 + signal`` (130 for SIGINT, 143 for SIGTERM).
- A **second** signal quits at once: every descendant process is killed with SIGKILL and the
  process exits with ``128 + signal``. The checkpoint on disk is the last one the run saved
  (checkpoints are written atomically, so it is never half-written). A signal that follows the
  first within :data:`SAME_STOP_SECONDS` is the same stop delivered twice, not a second one:
  ``timeout`` sends SIGTERM to its command and then to the command's whole process group, so the
  run's main process gets two at once (that hard-quit a run that was stopping cleanly).

Handlers can only be installed from the main thread; :func:`stop_on_signals` does nothing else
when called from another thread (the caller then keeps Python's default behaviour).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(Exception):
    """A run stopped on a signal after checkpointing; ``exit_code`` is ``128 + signal``.

    Parameters
    ----------
    signum : the signal that stopped the run (``signal.SIGINT`` or ``signal.SIGTERM``).
    message : the one line the CLI prints (what happened and how to resume).
    """

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


#: Seconds after the first stop signal within which another is the same stop, delivered twice.
SAME_STOP_SECONDS = 0.25


class StopRequest:
    """Whether a stop was asked for, and by which signal.

    ``event`` is set by the first SIGINT/SIGTERM; ``signum`` records which one. ``notice`` is
    called (from the signal handler, in the main thread) with the signal's name the first time,
    so the progress display can say that the run is stopping.
    """

    def __init__(self, notice: Callable[[str], None] | None = None) -> None:
        self.event = threading.Event()
        self.signum: int | None = None
        self.notice = notice
        #: ``time.monotonic()`` of the first stop signal (None before it).
        self.first_at: float | None = None

    @property
    def requested(self) -> bool:
        return self.event.is_set()

    @property
    def signal_name(self) -> str:
        return "" if self.signum is None else signal.Signals(self.signum).name

    def request(self, signum: int) -> None:
        """Ask the run to stop (what the first signal does)."""
        if self.signum is None:
            self.signum = int(signum)
            self.first_at = time.monotonic()
        self.event.set()

    def repeated(self) -> bool:
        """Whether a signal arriving now is the first one delivered again (see the module)."""
        return self.first_at is not None and time.monotonic() - self.first_at < SAME_STOP_SECONDS


def descendants(pid: int | None = None) -> list[int]:
    """Every live process below ``pid`` (default: this process) in the process tree, read from
    ``/proc`` (Linux); children before grandchildren. Empty where ``/proc`` is not readable."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    try:
        entries = list(proc.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the command name may hold spaces and parentheses: the fields after the last ')' are fixed
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out: list[int] = []
    frontier = [root]
    while frontier:
        nxt = []
        for p in frontier:
            for c in children.get(p, []):
                out.append(c)
                nxt.append(c)
        frontier = nxt
    return out


def kill_descendants(grace: float = 0.0, spare: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """Stop every descendant process except those in ``spare``: SIGTERM, wait up to ``grace``
    seconds, then SIGKILL what is left (``grace = 0``: SIGKILL at once). Returns the PIDs that
    were signalled."""
    pids = [p for p in descendants() if p not in spare]
    if grace > 0:
        for p in pids:
            _signal(p, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
    left = [p for p in descendants() if p not in spare and _alive(p)] if grace > 0 else pids
    for p in left:
        _signal(p, signal.SIGKILL)
    return pids


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:  # already gone, or not ours
        pass


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] != "Z"


@contextmanager
def stop_on_signals(
    request: StopRequest,
    resume_hint: str,
    spare: set[int] | frozenset[int] = frozenset(),
    silence: tuple[str, ...] = (),
) -> Iterator[StopRequest]:
    """Within the block, SIGINT and SIGTERM ask ``request`` to stop; a second one kills every
    descendant process and exits at once with ``128 + signal``, printing one line that names
    ``resume_hint`` (the command that resumes the run); processes in ``spare`` are left alone.
    ``silence`` names loggers (e.g. ``"ray"``) muted from the first signal on: a runtime torn
    down mid-task logs tracebacks that are not the user's to act on. The caller restores their
    levels once the teardown is over. The previous handlers come back after.
    Outside the main thread this yields ``request`` and installs nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def handler(signum: int, frame: object) -> None:
        if request.requested and request.repeated():  # the same stop, delivered to us twice
            return
        if request.requested:  # second signal: quit now
            kill_descendants(0.0, spare)
            name = signal.Signals(signum).name
            try:
                sys.stdout.flush()
                os.write(
                    2,
                    (
                        f"fedsim: quit at once on a second {name}; the checkpoint holds the last round it "
                        f"saved; resume with: {resume_hint}\n"
                    ).encode(),
                )
            finally:
                os._exit(128 + signum)
        request.request(signum)
        for name in silence:
            logging.getLogger(name).setLevel(logging.CRITICAL + 1)
        if request.notice is not None:
            request.notice(signal.Signals(signum).name)

    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    for s in STOP_SIGNALS:
        signal.signal(s, handler)
    try:
        yield request
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
