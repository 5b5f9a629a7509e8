"""Helpers shared by test modules (``tests/`` is on ``sys.path`` for every test package)."""

from __future__ import annotations

import pytest

from fedsim.cli import main


def run_cli(capsys, *args):
    with pytest.raises(SystemExit) as ei:
        main(list(args))
        raise SystemExit(0)
    out = capsys.readouterr()
    return ei.value.code, out.out, out.err
