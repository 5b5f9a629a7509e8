"""The run folder: checked before anything is loaded, and held exclusively while a run writes it.

:func:`prepare_out_dir` refuses a ``--out`` that is an existing file, a special file (a device
such as ``/dev/null``), under ``/proc`` or ``/sys``, or not writable — at once, before any data is
loaded or any noise calibrated. :class:`RunFolderLock` is an OS lock (``fcntl.flock``) on
``DIR/.fedsim.lock`` held for the whole life of a run, a resume or an audit; the lock file holds
the holder's PID, so a second process on the same folder is refused immediately with that PID
instead of interleaving ``metrics.jsonl``. The OS releases the lock when the holder exits, even
after ``kill -9``; a holder that ends normally also removes the file.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path
from types import TracebackType

from fedsim.errors import FedsimError

LOCK_NAME = ".fedsim.lock"
_SYSTEM_ROOTS = ("/proc", "/sys", "/dev")


def prepare_out_dir(path: str | Path) -> Path:
    """Create (if needed) and check the run folder ``path``; return it. Raises
    :class:`FedsimError` saying what to change for anything a run could not write into."""
    p = Path(path)
    resolved = p.resolve()
    if any(resolved == Path(r) or Path(r) in resolved.parents for r in _SYSTEM_ROOTS):
        raise FedsimError(f"--out {p}: {resolved} is a system folder; choose a folder of your own")
    if p.exists() and not p.is_dir():
        kind = "a special file" if not stat.S_ISREG(p.stat().st_mode) else "a file"
        raise FedsimError(f"--out {p} is {kind}, not a folder; choose a folder path (it is created if missing)")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FedsimError(f"--out {p}: cannot create the folder ({e.strerror}); choose a writable location") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise FedsimError(f"--out {p} is not writable; choose a writable folder")
    return p


class RunFolderLock:
    """Exclusive use of a run folder (a context manager).

    Parameters
    ----------
    folder : the run folder (must exist; see :func:`prepare_out_dir`).
    """

    def __init__(self, folder: str | Path) -> None:
        self.path = Path(folder) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> RunFolderLock:
        for _ in range(100):  # a holder may unlink the file between our open and our lock: open again
            fd = self._lock_once()
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        else:
            raise FedsimError(f"run folder {self.path.parent}: its lock file keeps changing; is another run starting?")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def _lock_once(self) -> int:
        """Open and lock the lock file (refused at once when another process holds it)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise FedsimError(f"run folder {self.path.parent}: cannot create its lock file ({e.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = ""
            try:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            finally:
                os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise FedsimError(
                    f"run folder {self.path.parent} is in use by process {holder or '(unknown)'}; "
                    f"wait for it to finish, or choose another --out"
                ) from None
            raise FedsimError(f"run folder {self.path.parent}: cannot lock it ({e.strerror})") from None
        return fd

    def release(self) -> None:
        """Remove the lock file and release the lock (a finished run leaves no lock file)."""
        if self._fd is not None:
            try:
                self.path.unlink(missing_ok=True)  # while still holding it: see acquire
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> RunFolderLock:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
