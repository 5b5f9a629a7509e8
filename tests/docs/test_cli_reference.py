"""docs/cli-reference.md is written from the ``fedsim`` command (``python -m fedsim.cli_reference``):
it must be what the commands define, and every option ``--help`` shows must be on it."""

from __future__ import annotations

import re
from pathlib import Path

import click
import typer.main

from fedsim import cli
from fedsim.cli_reference import reference

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "cli-reference.md"


def test_the_committed_page_is_the_generated_reference():
    assert PAGE.read_text(encoding="utf-8") == reference(), (
        "docs/cli-reference.md is stale: run `python -m fedsim.cli_reference > docs/cli-reference.md`"
    )


def _commands(command: click.Command, path: str):
    yield path, command
    if isinstance(command, click.Group):
        for name in command.list_commands(click.Context(command)):
            yield from _commands(command.commands[name], f"{path} {name}")


def test_every_command_and_option_is_on_the_page():
    text = reference()
    cli._use_factorize(full=True)
    commands = list(_commands(typer.main.get_command(cli.app), "fedsim"))
    assert len(commands) >= 15
    for path, command in commands:
        section = text.split(f"`{path}`\n", 1)[1].split("\n#", 1)[0]  # up to the next heading
        for param in command.params:
            for name in getattr(param, "opts", []):
                shown = f"`{name.upper()}`" if isinstance(param, click.Argument) else f"`{name}`"
                assert shown in section, (path, name)


def test_markup_in_help_texts_is_escaped():
    from fedsim.cli_reference import _cell

    assert _cell("sim.*, checkpoint.* and a|b in runs/<name>") == (
        r"sim.\*, checkpoint.\* and a\|b in runs/&lt;name&gt;"
    )
    assert not re.search(r"<(?!!--)[a-z]", PAGE.read_text(encoding="utf-8"))  # no raw HTML from help texts
