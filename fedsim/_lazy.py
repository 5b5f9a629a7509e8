"""Modules imported on first use, so that reading and validating a config stays light.

The config schema is built from the registries (datasets, models, mechanisms, filters, server
optimizers), whose modules use torch only inside their functions. They import it as

    if TYPE_CHECKING:
        import torch
    else:
        from fedsim._lazy import torch

so that `fedsim run bad.toml` or `fedsim privacy` answers before torch (about 1.5 s of CPU) is
imported: the first attribute read (`torch.zeros`, `torch.Tensor`) imports the real module,
and every read after that is a dictionary lookup on it. `tests/test_light_imports.py` counts
what a config error imports.
"""

from __future__ import annotations

import importlib
import types
from typing import Any


class LazyModule(types.ModuleType):
    """A stand-in for module `name` that imports it at the first attribute read.

    Parameters
    ----------
    name : str
        The module's import name, e.g. "torch".
    """

    def __getattr__(self, attr: str) -> Any:
        # Only called for names the stand-in does not hold: import (thread-safe, and a
        # dictionary lookup once imported) and read the real module's attribute.
        return getattr(importlib.import_module(self.__name__), attr)

    def __dir__(self) -> list[str]:
        return dir(importlib.import_module(self.__name__))


#: torch, imported when first used.
torch = LazyModule("torch")
