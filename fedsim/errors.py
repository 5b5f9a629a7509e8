"""The one exception type for errors a user can cause and fix."""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class FedsimError(Exception):
    """A user error: bad config, bad data path, or an incompatible combination.

    The message always says what is wrong and what to change. The CLI prints it
    without a traceback and exits with status 2; nothing has started when it is
    raised during validation.
    """


class RegistryFrozen(FedsimError):
    """A part registered after the config schema was built from the registries
    (:meth:`fedsim.registry.Registry.add`); :mod:`fedsim.plugins` turns it into advice."""


@contextmanager
def writing(path: str | Path, advice: str = "") -> Iterator[None]:
    """Turn a failed write of `path` into a one-line `FedsimError` naming it (a full
    disk's `OSError` names no file, and torch's zip writer reports one as a `RuntimeError`
    about an "unexpected pos"). `advice` follows "free space on that disk" (default: ", or write
    the run on another one (--out DIR)"), e.g. how to redo the write."""
    try:
        yield
    except OSError as e:
        raise FedsimError(_write_message(path, e.errno, e.strerror or str(e), advice)) from None
    except RuntimeError as e:  # torch.save: "[enforce fail at inline_container.cc] … unexpected pos …"
        text = str(e)
        if "unexpected pos" not in text and "write" not in text.lower():
            raise
        full = shutil.disk_usage(Path(path).parent).free < 2**20
        raise FedsimError(
            _write_message(
                path, errno.ENOSPC if full else errno.EIO, "No space left on device" if full else text, advice
            )
        ) from None


def _write_message(path: str | Path, code: int | None, why: str, advice: str) -> str:
    full = code in (errno.ENOSPC, errno.EDQUOT)
    fix = "free space on that disk" if full else "check that the folder is writable"
    then = advice or (", or write the run on another one (--out DIR)" if full else "")
    return f"could not write {path}: {why.splitlines()[0] if why else 'write failed'}; {fix}{then}"
