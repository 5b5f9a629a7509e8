"""The catalog of registered parts, written from the registries: ``docs/registries.md``.

``python -m fedsim.catalog > docs/registries.md`` regenerates it; a test checks that the file in
the repository is what the registries say, so the docs table cannot drift from the code.
"""

from __future__ import annotations

import html
import inspect
import re
from typing import Any

from pydantic import BaseModel

from fedsim.data import DATASETS
from fedsim.models import MODELS
from fedsim.privacy.mechanisms import MECHANISMS
from fedsim.server.filters import FILTERS
from fedsim.server.optim import OPTIMIZERS

_PARAM = re.compile(r"^\s{4}(\w+(?:, \w+)*) : (.*)$")


def _docstring_params(model: type[BaseModel]) -> dict[str, str]:
    """``key → description`` from the "Parameters" sections of ``model``'s docstrings (its bases'
    first, so a subclass's wording wins)."""
    out: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        doc = inspect.getdoc(cls) if cls.__doc__ else None
        if not doc or "Parameters" not in doc:
            continue
        current: list[str] = []
        for line in ("    " + ln for ln in doc.split("Parameters", 1)[1].splitlines()[2:]):
            m = _PARAM.match(line)
            if m:
                current = m.group(1).split(", ")
                for key in current:
                    out[key] = m.group(2).strip()
            elif line.strip() and current and line.startswith("        "):
                for key in current:
                    out[key] += " " + line.strip()
            elif not line.strip():
                current = []
    return out


def _cell(text: str) -> str:
    """`text` (Markdown with single-backtick code) made safe in a table cell on both renderers: a
    pipe outside code is escaped; a code span with a pipe becomes an HTML `<code>` with the pipe
    as `&#124;`, since Python-Markdown shows an escaped pipe inside code as typed and GitHub
    splits the cell at an unescaped one."""
    parts = re.split(r"(`[^`]*`)", text)  # odd indices: the code spans
    for i, part in enumerate(parts):
        if i % 2 == 0:
            parts[i] = part.replace("|", "\\|")
        elif "|" in part:
            parts[i] = "<code>" + html.escape(part[1:-1], quote=False).replace("|", "&#124;") + "</code>"
    return "".join(parts)


def _default(value: Any) -> str:
    return "—" if value is None else _cell(f"`{value!r}`")


def options_table(model: type[BaseModel], skip: tuple[str, ...]) -> list[str]:
    """Markdown rows ``| key | default | meaning |`` of ``model``'s own keys (``skip``: keys not to
    list, e.g. the discriminator and the keys every choice shares)."""
    docs = _docstring_params(model)
    rows = []
    for key, field in model.model_fields.items():
        if key in skip:
            continue
        meaning = _cell((field.description or docs.get(key, "")).replace("``", "`"))
        rows.append(f"| `{key}` | {_default(field.default)} | {meaning} |")
    return rows


def _section(title: str, key: str, parts: dict[str, Any], skip: tuple[str, ...], extra: str = "") -> list[str]:
    lines = [f"## {title} (`{key}`)", ""]
    for name, part in parts.items():
        lines.append(f"### `{name}`{extra.format(part=part) if extra else ''}")
        lines += ["", part.summary + ".", ""]
        rows = options_table(part.options, skip)
        if rows:
            lines += ["| key | default | meaning |", "|---|---|---|", *rows, ""]
    return lines


def catalog() -> str:
    """The whole catalog as markdown."""
    lines = [
        "# Registered parts",
        "",
        "Written by `python -m fedsim.catalog` from the registries (noise mechanisms, server filters,",
        "server optimizers, datasets, models); a test keeps this file equal to its output. Each",
        "part's keys go in its config table next to the choosing key; a key of another part is an",
        'error. The keys every choice of a table shares are in README "Configuration".',
        "",
        "Matrix-factorization mechanisms add correlated noise `C⁻¹Z` and need a scheme that bounds",
        "participation (`single`, `epochs`, `min_sep`); the run is accounted as one Gaussian",
        "mechanism. Independent noise is accounted per round, amplified by `poisson`/`fixed`.",
        "",
    ]
    lines += _section(
        "Noise mechanisms",
        "privacy.mechanism",
        dict(MECHANISMS),
        ("mechanism",),
        " — {part.correlated_label}",
    )
    lines += _section("Server filters", "filter.name", dict(FILTERS), ("name",))
    lines += _section("Server optimizers", "server.optimizer", dict(OPTIMIZERS), ("optimizer",))
    lines += _section(
        "Datasets",
        "data.name",
        dict(DATASETS),
        ("name", "max_users", "subset_seed", "cache_dir"),
        " — task `{part.task}`",
    )
    lines += ["## Models (`model.name`)", "", "| model | task | what |", "|---|---|---|"]
    lines += [f"| `{name}` | `{kind.task}` | {kind.summary} |" for name, kind in MODELS.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(catalog(), end="")
