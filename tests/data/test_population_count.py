"""`fedsim privacy` counts the bundled Shakespeare's users without loading it
(`count_shakespeare`, from the per-user text lengths the first load writes): the count must
equal the loaded population for every option that changes it."""

from __future__ import annotations

import pytest

from fedsim.data import load_federated, population_size
from fedsim.data.registry import data_spec
from fedsim.data.shakespeare import LENGTHS_FILE, count_shakespeare
from fedsim.errors import FedsimError


def test_no_count_before_the_first_load_then_the_loaded_population(tmp_path):
    spec = data_spec("shakespeare", cache_dir=str(tmp_path))
    assert count_shakespeare(spec) is None  # nothing built yet: population_size loads
    n = population_size(spec)
    assert n == load_federated(spec).population
    assert list(tmp_path.glob(f"shakespeare-*/{LENGTHS_FILE}"))
    assert count_shakespeare(spec) == n


@pytest.mark.parametrize(
    "options",
    [{"min_chars": 2000}, {"min_chars": 100, "window": 400}, {"max_users": 37}, {"max_users": 10**6}],
    ids=["min_chars", "window", "max_users", "max_users-above-N"],
)
def test_the_count_equals_the_loaded_population(tmp_path, options):
    load_federated(data_spec("shakespeare", cache_dir=str(tmp_path)))  # writes the lengths
    spec = data_spec("shakespeare", cache_dir=str(tmp_path), **options)
    assert count_shakespeare(spec) == load_federated(spec).population


def test_too_few_users_is_the_loaders_error(tmp_path):
    load_federated(data_spec("shakespeare", cache_dir=str(tmp_path)))
    spec = data_spec("shakespeare", cache_dir=str(tmp_path), min_chars=10**7)
    with pytest.raises(FedsimError, match="lower data.min_chars") as counted:
        count_shakespeare(spec)
    with pytest.raises(FedsimError, match="lower data.min_chars") as loaded:
        load_federated(spec)
    assert str(counted.value) == str(loaded.value)
