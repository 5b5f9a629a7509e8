"""The command-line reference, written from the ``fedsim`` command itself: ``docs/cli-reference.md``.

``python -m fedsim.cli_reference > docs/cli-reference.md`` regenerates it; a test checks that the
file in the repository is what the commands define (``tests/docs/test_cli_reference.py``), so the
page cannot drift from the code. Every command, argument and option is read from the click
command tree that Typer builds from :mod:`fedsim.cli` (``fedsim factorize`` with its options
from the mechanism registry), with the help texts ``--help`` prints.
"""

from __future__ import annotations

import re
from typing import Any

import click
import typer.main

_HEADER = [
    "# Command-line reference",
    "",
    "Written by `python -m fedsim.cli_reference` from the `fedsim` command itself (every command,",
    "argument and option, with the help `--help` prints); a test keeps this file equal to its",
    "output. What the commands write, the error contract and the resume rules are in",
    "[cli.md](cli.md). Every command also takes `--help`. `fedsim data CONFIG` is short for",
    "`fedsim data describe CONFIG`.",
    "",
]


def _text(text: str) -> str:
    """Help text as Markdown text: characters that Markdown would read as markup escaped (an
    underscore inside a word is not markup in Python-Markdown, so ``shakespeare_default`` stays;
    backticks are kept: the help texts use them for code)."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([*|\\])", r"\\\1", text)


def _cell(text: str) -> str:
    """Help text for one table cell (one line)."""
    return _text(" ".join(text.split()))


def _value(param: click.Parameter) -> str:
    """What an option takes (``TEXT``, ``a|b``…), or nothing for a flag."""
    if isinstance(param, click.Option) and param.is_flag:
        return ""
    if isinstance(param.type, click.Choice):
        return "|".join(str(c) for c in param.type.choices)
    return param.type.name.upper()


def _default(param: click.Parameter) -> str:
    if param.required:
        return "required"
    value: Any = param.default
    if getattr(param, "show_default", None) is False or value is None or callable(value):
        return ""
    if type(value).__name__ == "Sentinel" or value is False or value == ():
        return ""
    return f"`{value}`" if value != "" else '`""`'


def _names(param: click.Parameter) -> str:
    if isinstance(param, click.Argument):
        return f"`{param.name.upper() if param.name else ''}`"
    names = [*param.opts, *param.secondary_opts]
    return " / ".join(f"`{n}`" for n in names)


def _params(command: click.Command) -> list[str]:
    rows = []
    for param in command.params:
        if getattr(param, "hidden", False):
            continue
        value = _value(param)
        multiple = " (repeatable)" if getattr(param, "multiple", False) else ""
        rows.append(
            f"| {_names(param)} | {f'`{value}`' if value else ''}{multiple} | {_default(param)} "
            f"| {_cell(getattr(param, 'help', None) or '')} |"
        )
    if not rows:
        return []
    return ["| argument or option | value | default | meaning |", "|---|---|---|---|", *rows, ""]


def _section(command: click.Command, ctx: click.Context, level: int) -> list[str]:
    """The command's heading, usage, help and parameters, then its subcommands'."""
    usage = " ".join(command.collect_usage_pieces(ctx))
    lines = [f"{'#' * level} `{ctx.command_path}`", "", f"Usage: `{ctx.command_path} {usage}`", ""]
    for paragraph in (command.help or "").strip().split("\n\n"):
        if paragraph.strip():
            lines += [_text(paragraph.strip()), ""]
    lines += _params(command)
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                lines += _section(sub, click.Context(sub, info_name=name, parent=ctx), min(level + 1, 6))
    return lines


def reference() -> str:
    """The whole reference as Markdown."""
    from fedsim import cli

    cli._use_factorize(full=True)  # factorize with its registry-derived options, as when it runs
    root = typer.main.get_command(cli.app)
    ctx = click.Context(root, info_name="fedsim")
    return "\n".join(_HEADER + _section(root, ctx, 2)).rstrip("\n") + "\n"


if __name__ == "__main__":
    print(reference(), end="")
