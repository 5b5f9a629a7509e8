"""Which packages the distribution holds; every other piece of metadata is in pyproject.toml.

The source tree keeps fedsim's Flower glue beside the package, in ``strategies/`` and
``clients/`` (``flwr run .`` bundles the tree as it is), and the shipped experiment configs in
``experiments/``. The wheel installs all three inside the package, as ``fedsim.strategies``,
``fedsim.clients`` and ``fedsim.experiments``, so nothing but ``fedsim`` lands at the top of
site-packages. (``fedsim/__init__.py`` maps the two glue folders in a source tree.)
"""

from setuptools import find_packages, setup

BESIDE = {
    "fedsim.strategies": "strategies",
    "fedsim.clients": "clients",
    "fedsim.experiments": "experiments",
    "fedsim.experiments.sweeps": "experiments/sweeps",
}

setup(
    packages=find_packages(include=["fedsim", "fedsim.*"]) + sorted(BESIDE),
    package_dir=BESIDE,
)
