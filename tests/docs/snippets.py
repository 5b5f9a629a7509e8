"""Collect the fenced code blocks of documentation pages and run them as a reader would.

The conventions (docs/testing.md states them for page authors):

- ``bash``, ``sh``, ``shell``, ``console`` and ``python`` blocks are **run**, in page order, in
  one empty folder per page, with the test's Python environment's ``bin/`` first on ``PATH``
  (so ``fedsim``, ``python``, ``flwr`` are the ones under test). A ``bash`` block runs under
  ``bash -e -o pipefail``; a ``console`` block runs its ``$ `` lines; a ``python`` block runs
  with the test's interpreter. A block that fails fails the test.
- A block with a title (``python title="my_parts.py"``; Material shows the name above it) is a
  **file**: it is written under that name in the page's folder, for later blocks to use.
- ``<!-- not-run: REASON -->`` on the line before a block: **not run**. The reason is required
  and says why, and which test covers the commands instead, if one does.
- ``<!-- slow: REASON -->`` on the line before a block: run only by the slow suite
  (``make test-slow``).
- **Shrinks are stated on the page**: when the prose before a block says
  "the test runs it with `ARGS`", the runner appends ``ARGS`` to every ``fedsim run``,
  ``fedsim sweep`` and ``fedsim audit`` command of that block (and refuses a page where the
  block has no such command).
- Any other block (``text``, ``toml``, ``diff``…) must carry a title or a marker: an unmarked
  block that the runner cannot run is an error, so nothing slips through unchecked.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

#: Languages the runner executes.
SHELL = ("bash", "sh", "shell", "console")
RUNNABLE = (*SHELL, "python", "py")
#: Seconds one block may take.
BLOCK_TIMEOUT = 600
#: What the tests found and ran, for the summary at the end of the session (tests/docs/conftest.py).
REPORT: list[str] = []
RAN: dict[str, int] = {}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>not-run|slow)\s*:(?P<reason>.*?)-->\s*$")
_LOOSE_MARKER = re.compile(r"<!--.*\b(?:not[- _]?run|no[- _]?run|skip|slow)\b", re.I)
_TITLE = re.compile(r'\btitle="(?P<title>[^"]+)"')
_SHRINK = re.compile(r"the test runs (?:it|them|this) with `(?P<args>[^`]+)`", re.I)
_SHRINKABLE = re.compile(r"^\s*fedsim\s+(?:run|sweep|audit)\b")


class SnippetError(Exception):
    """A page that breaks the conventions, or a block that failed."""


@dataclass(frozen=True)
class Block:
    """One fenced block of a page.

    Attributes
    ----------
    page : the page's path relative to ``docs/``. line : the line of its opening fence (1-based).
    lang : the first word of the info string (``""`` without one). code : its text.
    title : the file name it is written to, if any. marker : ``"not-run"``, ``"slow"`` or None.
    reason : the marker's reason. shrink : the arguments the page says the test adds, if any.
    """

    page: str
    line: int
    lang: str
    code: str
    title: str | None = None
    marker: str | None = None
    reason: str = ""
    shrink: str | None = None

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"

    @property
    def action(self) -> str:
        """``write``, ``not-run``, ``slow``, ``run`` or ``unmarked``."""
        if self.marker == "not-run":
            return "not-run"
        if self.title:
            return "write"
        if self.lang not in RUNNABLE:
            return "unmarked"
        return "slow" if self.marker == "slow" else "run"


def collect(text: str, page: str) -> list[Block]:
    """The fenced blocks of a page's Markdown ``text``; :class:`SnippetError` for a malformed
    marker or shrink."""
    lines = text.splitlines()
    blocks: list[Block] = []
    prose: list[str] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            prose.append(lines[i])
            i += 1
            continue
        end = _closing(lines, i, m.group("fence"))
        indent = len(m.group("indent"))
        code = "\n".join(ln[indent:] if ln[:indent].strip() == "" else ln.lstrip() for ln in lines[i + 1 : end])
        blocks.append(_block(page, i + 1, m.group("info"), code + "\n", prose))
        prose = []
        i = end + 1
    return blocks


def _closing(lines: list[str], start: int, fence: str) -> int:
    for j in range(start + 1, len(lines)):
        s = lines[j].strip()
        if s.startswith(fence) and set(s) == {fence[0]}:
            return j
    raise SnippetError(f"line {start + 1}: the code block opened here is never closed")


def _block(page: str, line: int, info: str, code: str, prose: list[str]) -> Block:
    words = info.strip().split()
    lang = words[0].lower() if words and "=" not in words[0] else ""
    title = _TITLE.search(info)
    last = next((ln for ln in reversed(prose) if ln.strip()), "")
    marker = _MARKER.match(last)
    if _LOOSE_MARKER.search(last) and not marker:
        raise SnippetError(f"docs/{page}:{line}: malformed marker {last.strip()!r}; write <!-- not-run: REASON -->")
    reason = marker.group("reason").strip() if marker else ""
    if marker and not reason:
        raise SnippetError(f"docs/{page}:{line}: the {marker.group('kind')} marker needs a reason")
    shrinks = _SHRINK.findall(" ".join(prose))
    if len(shrinks) > 1:
        raise SnippetError(f"docs/{page}:{line}: more than one shrink stated before this block: {shrinks}")
    return Block(
        page,
        line,
        lang,
        code,
        title=title.group("title") if title else None,
        marker=marker.group("kind") if marker else None,
        reason=reason,
        shrink=shrinks[0] if shrinks else None,
    )


def shrunk(block: Block) -> str:
    """The block's code with the page's stated shrink applied (the code itself without one)."""
    if block.shrink is None:
        return block.code
    if block.lang not in SHELL:
        raise SnippetError(f"{block.where}: a shrink applies to shell blocks only")
    out, hits = [], 0
    for line in block.code.replace("\\\n", " ").splitlines():
        if _SHRINKABLE.match(line.removeprefix("$ ")):
            body, comment = _split_comment(line)
            line = f"{body.rstrip()} {block.shrink}" + (f"  {comment}" if comment else "")
            hits += 1
        out.append(line)
    if not hits:
        raise SnippetError(f"{block.where}: the page states a shrink but the block has no fedsim run/sweep/audit")
    return "\n".join(out) + "\n"


def _split_comment(line: str) -> tuple[str, str]:
    """``line`` split before a trailing shell comment (a ``#`` after a blank, outside quotes)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and i and line[i - 1] in " \t":
            return line[:i], line[i:]
    return line, ""


def environment() -> dict[str, str]:
    """The environment blocks run in: the test session's (tests/conftest.py makes it offline, with
    Flower's and Ray's folders in a temporary directory), with this interpreter's ``bin/`` first
    on ``PATH`` and no ``FEDSIM_PLUGINS`` leaking in."""
    env = {k: v for k, v in os.environ.items() if k != "FEDSIM_PLUGINS"}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def command(block: Block) -> list[str]:
    """The argv that runs ``block``."""
    code = shrunk(block)
    if block.lang in ("python", "py"):
        return [sys.executable, "-c", code]
    if block.lang == "console":
        code = "\n".join(ln[2:] for ln in _console_commands(code)) + "\n"
    return ["bash", "-e", "-o", "pipefail", "-c", code]


def _console_commands(code: str) -> list[str]:
    """The ``$ `` lines of a console block, continuation lines joined."""
    out: list[str] = []
    for line in code.replace("\\\n", " ").splitlines():
        if line.startswith("$ "):
            out.append(line)
    return out


def run_block(block: Block, folder: Path, env: dict[str, str]) -> None:
    """Run one block in ``folder``; :class:`SnippetError` with its output when it fails. Every
    process the block left behind (in its own session) is killed afterwards."""
    argv = command(block)
    proc = subprocess.Popen(
        argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, _ = proc.communicate()
        raise SnippetError(f"{block.where}: timed out after {BLOCK_TIMEOUT} s\n{out[-3000:]}") from None
    finally:
        _kill_group(proc.pid)
    if proc.returncode != 0:
        shown = argv[-1] if block.lang not in ("python", "py") else block.code
        raise SnippetError(f"{block.where}: exit status {proc.returncode}\n--- ran:\n{shown}--- output:\n{out[-4000:]}")


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_page(blocks: list[Block], folder: Path, *, slow: bool = False) -> list[Block]:
    """Write the page's files and run its blocks in order in ``folder`` (``slow``: the blocks
    marked slow too); returns the blocks run."""
    env = environment()
    ran = []
    for block in blocks:
        if block.action == "write":
            assert block.title is not None
            path = folder / block.title
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.code, encoding="utf-8")
        elif block.action == "run" or (slow and block.action == "slow"):
            run_block(block, folder, env)
            ran.append(block)
    return ran
