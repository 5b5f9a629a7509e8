"""Every code block of the quickstart and the how-tos runs as written (``tests/docs/snippets.py``
holds the runner and its conventions): shell commands with the environment's ``fedsim`` on
``PATH``, Python blocks with its interpreter, files written where the page names them, and the
shrinks each page states applied. A block that is not run carries a visible reason."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from docs.snippets import RAN, REPORT, Block, SnippetError, collect, run_page, shrunk

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: The pages whose blocks must run: the quickstart, the Python API page, the Flower wrapper's page
#: and every how-to in docs/howto/. (flower.md's diffs to Flower's quickstart app are checked
#: against the example by tests/flower/test_quickstart_app.py, which runs the changed app.)
PAGES = [
    "index.md",
    "api.md",
    "flower.md",
    *sorted(p.relative_to(DOCS).as_posix() for p in DOCS.glob("howto/*.md")),
]
#: Blocks the default suite must run at least (the count when this was written; raise it).
MIN_RUN = 23
#: Modules a page's blocks need (optional extras): the page is skipped, naming them, without.
NEEDS = {"howto/tracking.md": ("mlflow", "tensorboard"), "howto/sweeps.md": ("ray.tune",)}


def _blocks(page: str) -> list[Block]:
    return collect((DOCS / page).read_text(encoding="utf-8"), page)


def _need(page: str) -> None:
    for module in NEEDS.get(page, ()):
        if importlib.util.find_spec(module.split(".")[0]) is None:
            pytest.skip(f"{page} needs {module} (make install installs it)")


def test_every_block_is_run_written_or_marked_with_a_reason():
    blocks = [b for page in PAGES for b in _blocks(page)]
    unmarked = [f"{b.where} ({b.lang or 'no language'})" for b in blocks if b.action == "unmarked"]
    assert not unmarked, (
        'code blocks the test cannot run: give each a runnable language, a title="FILE", or '
        f"<!-- not-run: REASON --> on the line before it: {unmarked}"
    )
    counts = Counter(b.action for b in blocks)
    REPORT[:] = [
        f"{len(blocks)} code blocks on {len(PAGES)} pages: {counts['run']} run by the default suite, "
        f"{counts['slow']} only by the slow suite, {counts['write']} written as files for later blocks, "
        f"{counts['not-run']} not run:",
        *(f"  {b.where}: {b.reason}" for b in blocks if b.action == "not-run"),
    ]
    assert counts["run"] >= MIN_RUN, counts


def _runnable(slow: bool) -> list[str]:
    wanted = {"run", "slow"} if slow else {"run"}
    return [p for p in PAGES if any(b.action in wanted for b in _blocks(p))]


@pytest.mark.parametrize("page", _runnable(slow=False))
def test_the_page_runs_as_written(page, tmp_path):
    _need(page)
    blocks = _blocks(page)
    ran = run_page(blocks, tmp_path)
    assert len(ran) == sum(b.action == "run" for b in blocks)
    RAN[page] = len(ran)


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in _runnable(slow=True) if any(b.action == "slow" for b in _blocks(p))])
def test_the_page_runs_with_its_slow_blocks(page, tmp_path):
    _need(page)
    blocks = _blocks(page)
    ran = run_page(blocks, tmp_path, slow=True)
    assert len(ran) == sum(b.action in ("run", "slow") for b in blocks)


# ---------------------------------------------------------------------------------------------
# the runner itself, on made-up pages

PAGE = """Intro.

<!-- not-run: it needs a cluster -->
```bash
false
```

```toml title="conf/a.toml"
x = 1
```

Shrunk (the test runs it with `--set rounds=2`):

```bash
fedsim run conf/a.toml \\
  --out runs/x   # a comment
echo done
```

```text
plain
```
"""


def test_the_runner_reads_markers_titles_and_shrinks():
    blocks = collect(PAGE, "made-up.md")
    assert [b.action for b in blocks] == ["not-run", "write", "run", "unmarked"]
    assert blocks[0].reason == "it needs a cluster"
    assert blocks[1].title == "conf/a.toml" and blocks[1].code == "x = 1\n"
    assert shrunk(blocks[2]).splitlines()[0] == "fedsim run conf/a.toml    --out runs/x --set rounds=2  # a comment"
    assert blocks[3].shrink is None
    # a sentence may start with it: a stated shrink is applied, never silently ignored
    (opening,) = collect("The test runs it with `--set rounds=2`:\n\n```bash\nfedsim run --out r\n```\n", "x.md")
    assert shrunk(opening) == "fedsim run --out r --set rounds=2\n"


def test_a_failing_block_fails_and_a_file_is_written_first(tmp_path):
    page = '```python title="m.py"\nX = 3\n```\n\n```python\nimport m\nassert m.X == 3\n```\n\n```bash\ntest -f m.py\nfalse\necho never\n```\n'
    blocks = collect(page, "made-up.md")
    with pytest.raises(SnippetError, match=r"made-up.md:10: exit status 1"):
        run_page(blocks, tmp_path)
    assert (tmp_path / "m.py").read_text() == "X = 3\n"


@pytest.mark.parametrize(
    "page,message",
    [
        ("<!-- not-run: -->\n```bash\ntrue\n```\n", "needs a reason"),
        ("<!-- not run because -->\n```bash\ntrue\n```\n", "malformed marker"),
        ("```bash\ntrue\n", "never closed"),
    ],
)
def test_a_malformed_page_is_refused(page, message):
    with pytest.raises(SnippetError, match=message):
        collect(page, "made-up.md")


def test_a_shrink_without_a_command_to_apply_it_to_is_refused():
    (block,) = collect("(the test runs it with `--set rounds=1`)\n\n```bash\necho hi\n```\n", "made-up.md")
    with pytest.raises(SnippetError, match="no fedsim run/sweep/audit"):
        shrunk(block)
