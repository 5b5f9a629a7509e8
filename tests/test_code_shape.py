"""Every function in fedsim/, strategies/ and clients/ stays short: at most 80 lines, its
docstring not counted (a long docstring is documentation, not code). Complexity (CC ≤ 15) is
ruff's C901 rule, run by ``make lint``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 80


def function_lengths() -> list[tuple[int, str]]:
    """(lines without the docstring, ``file:function``) for every function and method."""
    out = []
    for pkg in ("fedsim", "strategies", "clients"):
        for f in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                out.append((length(node), f"{f.relative_to(ROOT)}:{node.name}"))
    return out


def length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from ``def`` to the last line of the body, less the docstring's lines."""
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def test_the_length_count_ignores_only_the_docstring():
    documented = 'def f(\n    a,\n):\n    """Doc.\n\n    More.\n    """\n    x = a\n    return x\n'
    bare = "def g():\n    'not first' if False else None\n    return 1\n"
    assert length(ast.parse(documented).body[0]) == 5  # signature (3) and body (2)
    assert length(ast.parse(bare).body[0]) == 3  # a string expression that is not a docstring counts


def test_no_function_is_longer_than_80_lines():
    lengths = function_lengths()
    assert len(lengths) > 300
    too_long = sorted((n, name) for n, name in lengths if n > MAX_LINES)
    assert not too_long, f"functions over {MAX_LINES} lines (docstring excluded): {too_long}"
