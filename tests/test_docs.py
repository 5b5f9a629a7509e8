"""The documentation site and the README: ``mkdocs build --strict`` (a broken link or API
reference fails it), every page in the navigation, and the README stays a short front door. The
code blocks of the quickstart and the how-tos run in ``tests/docs/test_snippets.py``; the
generated command-line reference is checked in ``tests/docs/test_cli_reference.py``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_site_builds_with_strict_checks(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (make install installs it)")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "index.html").exists()


def test_the_readme_is_a_short_front_door():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    for page in re.findall(r"docs/[\w/.-]+\.md", text):
        assert (ROOT / page).exists(), page


def test_every_page_is_in_the_navigation():
    yaml = pytest.importorskip("yaml")
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]

    def pages(item):
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for value in item.values():
                yield from pages(value)
        else:
            for value in item:
                yield from pages(value)

    listed = set(pages(nav))
    docs = ROOT / "docs"
    missing = sorted(
        p.relative_to(docs).as_posix() for p in docs.rglob("*.md") if p.relative_to(docs).as_posix() not in listed
    )
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"
