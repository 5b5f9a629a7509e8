"""Helpers shared by test modules (``tests/`` is on ``sys.path`` for every test package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from fedsim.cli import main


def run_cli(capsys, *args):
    with pytest.raises(SystemExit) as ei:
        main(list(args))
        raise SystemExit(0)
    out = capsys.readouterr()
    return ei.value.code, out.out, out.err


def text_users(users: int, seed: int):
    """Next-character users (30 symbols, windows of 10) with text lengths 26, 31 or 40, so
    different sample counts."""
    from fedsim.data.shakespeare import FederatedText

    rng = np.random.default_rng(seed)
    texts = [rng.integers(0, 30, size=int(n)).astype(np.uint8) for n in rng.choice([26, 31, 40], size=users)]
    return FederatedText([f"u{i}" for i in range(users)], texts, window=10, vocab_size=30)


class CrashAfter:
    """A run callback that fails the run once round ``r``'s row has been published (a crash
    before the next checkpoint)."""

    def __init__(self, r: int) -> None:
        self.r = r

    def on_start(self, run, out, resumed):
        pass

    def on_round_end(self, row):
        if row["round"] == self.r:
            raise RuntimeError(f"crash after round {self.r}")

    def on_stop(self, signal_name):
        pass

    def on_end(self, summary, status):
        pass

    def close(self):
        pass


def experiment_script(name: str) -> ModuleType:
    """The script ``experiments/<name>.py`` imported as a module (the experiments folder is not a
    package in the source tree), for tests of its functions."""
    path = Path(__file__).resolve().parents[1] / "experiments" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
