"""docs/registries.md is written from the registries (``python -m fedsim.catalog``): it must say
what the code registers, and every registered part must be in it."""

from __future__ import annotations

from pathlib import Path

from fedsim.catalog import catalog
from fedsim.data import DATASETS
from fedsim.models import MODELS
from fedsim.privacy.mechanisms import MECHANISMS
from fedsim.server.filters import FILTERS
from fedsim.server.optim import OPTIMIZERS

ROOT = Path(__file__).resolve().parents[1]


def test_docs_registries_is_the_catalog():
    assert (ROOT / "docs" / "registries.md").read_text(encoding="utf-8") == catalog(), (
        "docs/registries.md is stale: run `python -m fedsim.catalog > docs/registries.md`"
    )


def test_every_registered_part_and_option_is_listed():
    text = catalog()
    for registry in (MECHANISMS, FILTERS, OPTIMIZERS, DATASETS):
        for name, part in registry.items():
            assert f"### `{name}`" in text
            for key in part.options.model_fields:
                if key not in ("mechanism", "name", "optimizer", "max_users", "subset_seed", "cache_dir"):
                    assert f"| `{key}` |" in text, (name, key)
    for name in MODELS:
        assert f"| `{name}` |" in text
