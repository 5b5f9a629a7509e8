"""fedsim: a federated-learning simulator for user-level differential privacy.

The public API is `fedsim.__all__` (defined in `fedsim.api`): `load_config`, `run`,
`privacy_report`, `sweep`, `audit` and the `register_*` functions; for Flower apps,
`fedsim.flower`. Every other module is internal and may move between versions.

Everything here is importable without a running Flower process. The Flower glue is
`fedsim.strategies` (server side) and `fedsim.clients` (client side). In the source tree and
in a Flower app bundle (`flwr run .`) those two packages are the top-level folders
`strategies/` and `clients/` beside this package; the wheel installs them inside it. Either
way they are imported by their `fedsim.` names only, so no generic top-level `strategies` or
`clients` package is ever installed or imported.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from fedsim.errors import FedsimError

#: The Flower glue packages kept beside the package in the source tree.
_BESIDE = ("strategies", "clients")


def _map_packages_beside() -> None:
    """Import `strategies/` and `clients/` beside this package as `fedsim.strategies` and
    `fedsim.clients` (source tree, Flower app bundle); an installed wheel holds them inside
    the package and needs nothing. Only the packages' `__init__` runs here (a docstring)."""
    here = Path(__file__).resolve().parent
    for name in _BESIDE:
        full = f"{__name__}.{name}"
        src = here.parent / name / "__init__.py"
        if full in sys.modules or (here / name).is_dir() or not src.is_file():
            continue
        spec = importlib.util.spec_from_file_location(full, src, submodule_search_locations=[str(src.parent)])
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
        globals()[name] = module  # as an import of the subpackage binds it on the package


_map_packages_beside()


def _version() -> str:
    """The installed distribution's version (the source tree's `pyproject.toml` otherwise)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fedsim")
    except PackageNotFoundError:  # a source tree that was never installed
        return "0.0.0+unknown"


__version__ = _version()

#: The public Python API (`fedsim.api`), imported on first use so that `import fedsim`
#: stays light (no torch, Flower or Ray until a function is called). Everything else may move.
_API = (
    "ModelKind",
    "RunResult",
    "audit",
    "load_config",
    "privacy_report",
    "register_dataset",
    "register_filter",
    "register_local_update",
    "register_mechanism",
    "register_model",
    "register_optimizer",
    "run",
    "sweep",
)
__all__ = ["FedsimError", "__version__", *_API]


def __getattr__(name: str) -> object:
    if name in _API:
        from fedsim import api

        return getattr(api, name)
    raise AttributeError(f"module 'fedsim' has no attribute {name!r}")
