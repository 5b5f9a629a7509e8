"""The documentation site and the README: ``mkdocs build --strict`` (a broken link or API
reference fails it), the quickstart's shell commands and the Python blocks of docs/api.md run as
written, and the README stays a short front door."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _blocks(page: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", (ROOT / "docs" / page).read_text(encoding="utf-8"), flags=re.S)


def test_the_site_builds_with_strict_checks(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (make install installs it)")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "index.html").exists()


def test_the_quickstart_commands_run_as_written(tmp_path):
    commands = [ln for block in _blocks("index.md", "bash") for ln in block.splitlines() if ln.strip()]
    assert len(commands) >= 5
    for line in commands:
        argv = shlex.split(line)
        if argv[0] == "fedsim":
            argv = [sys.executable, "-m", "fedsim.cli", *argv[1:]]
        elif argv[0] == "python":
            argv = [sys.executable, *argv[1:]]
        r = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"{line}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    assert (tmp_path / "runs" / "first" / "ledger.json").exists()


def test_the_api_page_examples_run(tmp_path):
    blocks = _blocks("api.md", "python")
    assert blocks
    for code in blocks:
        r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{code}\n{r.stderr[-3000:]}"


def test_the_readme_is_a_short_front_door():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    for page in re.findall(r"docs/[\w/.-]+\.md", text):
        assert (ROOT / page).exists(), page
