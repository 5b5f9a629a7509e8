"""The built site's HTML shows what the Markdown and the docstrings mean (issue 47).

``mkdocs build --strict`` passes on pages that render wrongly: Python-Markdown turns a list that
follows a paragraph line, or a nested list indented less than four spaces, into a paragraph with
inline ``- …``; mkdocstrings prints Sphinx roles (``:func:``) and reST double backticks as typed,
and a numpy-style parameter written ``name : description`` puts the description in the Type
column. This test builds the site once (about 2 s) and reads every page's HTML:

- no paragraph is a list in disguise (its text starts with ``- ``/``1. `` or has such a line);
- no list item swallowed a nested list as text;
- no Sphinx role, doubled backtick or escaped pipe ``\\|`` in the rendered text;
- every row of the API reference's Parameters/Attributes tables has a Description, and its Type
  cell holds a type, not prose.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
_LIST_LINE = re.compile(r"[ \t]*(?:[-*+]|\d+[.)])[ \t]")
_ROLE = re.compile(r":(?:func|class|meth|mod|attr|obj|data|exc|ref|py:\w+):")


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    parent: Node | None = None
    children: list[Node | str] = field(default_factory=list)

    def text(self, skip: frozenset[str] = frozenset()) -> str:
        """The node's text, without the subtrees whose tag is in ``skip``."""
        return "".join(c if isinstance(c, str) else ("" if c.tag in skip else c.text(skip)) for c in self.children)

    def iter(self, tag: str | None = None):
        """Every element below this one (depth first), or those with tag ``tag``."""
        for c in self.children:
            if isinstance(c, Node):
                if tag is None or c.tag == tag:
                    yield c
                yield from c.iter(tag)

    def inside(self, *tags: str) -> bool:
        """Whether an ancestor has one of ``tags``."""
        p = self.parent
        while p is not None:
            if p.tag in tags:
                return True
            p = p.parent
        return False

    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())


class _TreeBuilder(HTMLParser):
    """A minimal DOM: enough for the checks below (the theme's HTML is well formed)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {})
        self.cur = self.root

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: v or "" for k, v in attrs}, self.cur)
        self.cur.children.append(node)
        if tag not in _VOID:
            self.cur = node

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Node(tag, {k: v or "" for k, v in attrs}, self.cur))

    def handle_endtag(self, tag):
        p = self.cur
        while p is not None and p.tag != tag:
            p = p.parent
        if p is not None and p.parent is not None:  # a stray end tag is ignored
            self.cur = p.parent

    def handle_data(self, data):
        self.cur.children.append(data)


def parse(html: str) -> Node:
    b = _TreeBuilder()
    b.feed(html)
    b.close()
    return b.root


def _article(page: Node) -> Node:
    """The page's content (the theme's navigation and header are not the pages' Markdown)."""
    return next((n for n in page.iter("article")), page)


def _short(s: str, n: int = 100) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 1] + "…"


def page_faults(html: str) -> list[str]:
    """Every rendering fault of one page, each as a line that quotes it."""
    faults = []
    doc = _article(parse(html))
    for p in doc.iter("p"):
        # a marker in the paragraph's own text, not in its <strong> ("**1. Certificates.**" is a
        # heading in bold, not a list)
        first = p.children[0] if p.children else ""
        own = [c for c in p.children if isinstance(c, str)]
        if (isinstance(first, str) and _LIST_LINE.match(first.lstrip("\n"))) or any(
            re.search(r"\n[ \t]*(?:[-*+]|\d+[.)])[ \t]", t) for t in own
        ):
            faults.append(f"paragraph holds a list: {_short(p.text())!r}")
    for li in doc.iter("li"):
        own = li.text(skip=frozenset({"ul", "ol", "pre", "p"}))
        if re.search(r"\n[ \t]*(?:[-*+]|\d+[.)])[ \t]+\S", own):
            faults.append(f"list item holds a nested list as text: {_short(own)!r}")
    for code in doc.iter("code"):
        if code.text().startswith("```"):  # a fence's first line, shown as code on purpose
            code.children = ["(fence)"]
    prose = doc.text(skip=frozenset({"pre", "script", "style"}))
    for m in _ROLE.finditer(prose):
        faults.append(f"Sphinx role shown: {_short(prose[max(0, m.start() - 40) : m.end() + 40])!r}")
    for m in re.finditer(r"``|\\\|", prose):
        faults.append(f"{m.group()!r} shown: {_short(prose[max(0, m.start() - 40) : m.end() + 40])!r}")
    for code in doc.iter("code"):
        if not code.inside("pre") and re.match(r"`|.*`$", code.text(), re.S):
            faults.append(f"backtick inside code: {_short(code.text())!r}")
    faults += _table_faults(doc)
    return faults


def _table_faults(doc: Node) -> list[str]:
    """mkdocstrings' section tables (Name | Type | Description | Default): a description in each
    row, and a type (no sentence) in the Type column."""
    faults = []
    for table in doc.iter("table"):
        heads = [" ".join(th.text().split()) for th in table.iter("th")]
        if "Description" not in heads or "Name" not in heads:
            continue
        d, t = heads.index("Description"), heads.index("Type") if "Type" in heads else None
        for row in table.iter("tr"):
            cells = [c for c in row.children if isinstance(c, Node) and c.tag == "td"]
            if len(cells) != len(heads):
                continue
            name = " ".join(cells[0].text().split())
            if not cells[d].text().strip():
                faults.append(f"no Description for {name!r}")
            if t is not None:
                typ = " ".join(cells[t].text().split())
                if typ.endswith(".") or ". " in typ or "; " in typ or len(typ.replace("|", " ").split()) > 8:
                    faults.append(f"prose in the Type column of {name!r}: {_short(typ)!r}")
    return faults


def site_faults(site: Path) -> dict[str, list[str]]:
    """``page_faults`` of every page of a built site, by page."""
    out = {}
    for f in sorted(site.rglob("*.html")):
        rel = f.relative_to(site).as_posix()
        if rel.startswith(("assets/", "search/")) or rel == "404.html":
            continue
        faults = page_faults(f.read_text(encoding="utf-8"))
        if faults:
            out[rel] = faults
    return out


def shallow_nested_items(text: str) -> list[int]:
    """Line numbers of list items indented 1 to 3 spaces (outside code fences). Python-Markdown
    nests a list only at four spaces; at two or three the items join the parent list as
    siblings, which no HTML check can tell from a list written flat."""
    out, fence = [], ""
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith(("```", "~~~")):
            marker = stripped[:3]
            fence = "" if fence == marker else (fence or marker)
            continue
        if not fence and re.match(r" {1,3}(?:[-*+]|\d+[.)])[ \t]+\S", line):
            out.append(number)
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (make install installs it)")
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out


def test_every_page_renders_its_lists_code_and_tables_as_written(site):
    faults = site_faults(site)
    report = "\n".join(f"{page}: {f}" for page, fs in faults.items() for f in fs)
    assert not faults, f"{sum(map(len, faults.values()))} rendering faults:\n{report}"


def test_the_checks_catch_each_fault():
    """The checker against small pages with each fault, and the same pages written right."""
    bad = {
        "run-on list": "<article><p>The run folder holds:\n- <code>config.toml</code>;\n- <code>plots/</code>.</p></article>",
        "collapsed steps": "<article><p>- <code>poisson</code>: each node joins</p></article>",
        "numbered": "<article><p>2. It clips.</p></article>",
        "swallowed": "<article><ol><li>It chooses:\n   - poisson;\n   - single.</li></ol></article>",
        "role": "<article><p>as for :func:<code>run</code>.</p></article>",
        "backticks": "<article><p>the folder <code>``runs/x``</code></p></article>",
        "pipe": r"<article><table><tr><td>a \| b</td></tr></table></article>",
        "type column": (
            "<article><table><thead><tr><th>Name</th><th>Type</th><th>Description</th><th>Default</th></tr></thead>"
            "<tbody><tr><td>out</td><td><code>the run folder.</code></td><td><div> </div></td><td>None</td></tr>"
            "</tbody></table></article>"
        ),
    }
    for what, html in bad.items():
        assert page_faults(html), what
    good = (
        "<article><p>The run folder holds:</p><ul><li><code>config.toml</code>;</li></ul>"
        "<ol><li><p>It chooses:</p><ul><li>poisson;</li></ul></li></ol><p>as for <code>run</code>; "
        "a - b and 1.5 - 2. are not lists</p><pre><code>``x`` :func:`y` a \\| b\n- z</code></pre>"
        "<table><thead><tr><th>Name</th><th>Type</th><th>Description</th><th>Default</th></tr></thead>"
        "<tbody><tr><td>out</td><td><code>str | Path | None</code></td><td><p>the run folder.</p></td>"
        "<td>None</td></tr></tbody></table></article>"
    )
    assert page_faults(good) == []


def test_nested_lists_are_indented_four_spaces():
    # docs/changelog.md is a link to CHANGELOG.md, which the project lead writes
    pages = [p for p in sorted((ROOT / "docs").rglob("*.md")) if not p.is_symlink()]
    bad = {p.relative_to(ROOT).as_posix(): shallow_nested_items(p.read_text(encoding="utf-8")) for p in pages}
    bad = {page: lines for page, lines in bad.items() if lines}
    assert not bad, f"list items nested at 1-3 spaces (Python-Markdown needs 4), by page and line: {bad}"
    assert shallow_nested_items("- a\n  - b\n\n1. c\n   - d\n\n```\n  - e\n```\n") == [2, 5]


@pytest.mark.slow  # a browser start per view: about 30 s
def test_the_pages_render_in_a_headless_browser(site, tmp_path):
    """Every view of tests/docs/site_screenshots.py renders in chromium and shows something."""
    from docs import site_screenshots as shots

    if shots.browser() is None:
        pytest.skip("no headless browser (apt-get install chromium)")
    image = pytest.importorskip("PIL.Image")
    pngs = shots.main(["--site", str(site), "--out", str(tmp_path)])
    assert [p.stem for p in pngs] == [v[0] for v in shots.VIEWS]
    for png in pngs:
        full = image.open(png).convert("L")
        content = full.crop((290, 70, 1000, full.height - 80))  # not the header, footer or navigation
        dark = sum(content.histogram()[:128])  # text pixels
        assert dark > 0.002 * content.width * content.height, f"{png.name}'s content is (almost) blank"
