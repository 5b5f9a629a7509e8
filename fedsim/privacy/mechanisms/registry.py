"""The registry of noise mechanisms: the one list of their names.

A family module registers its mechanism with :func:`register` when it is imported;
:mod:`fedsim.privacy.mechanisms` imports every family, in the order the docs and the CLI list
them. The config's choices, ``fedsim factorize --mechanism``, the accountant's test for
correlated noise and the docs table all read :data:`MECHANISMS`.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import ValidationError

from fedsim.errors import FedsimError
from fedsim.privacy.mechanisms.base import Mechanism, MechanismOptions
from fedsim.registry import Registry

#: name → the registered mechanism, in registration order.
MECHANISMS: Registry[Mechanism] = Registry("noise mechanism", "privacy.mechanism")

M = TypeVar("M", bound=type[Mechanism])


def register(cls: M) -> M:
    """Class decorator: register one instance of the mechanism ``cls`` under ``cls.name``."""
    MECHANISMS.add(cls.name, cls(), options=cls.options)
    return cls


def mechanism_names(correlated: bool | None = None) -> tuple[str, ...]:
    """Registered names; ``correlated=True``: matrix-factorization ones only, False: the others."""
    return tuple(n for n, m in MECHANISMS.items() if correlated is None or m.correlated == correlated)


def get_mechanism(name: str) -> Mechanism:
    """The mechanism registered as ``name``; :class:`FedsimError` listing the names otherwise."""
    return MECHANISMS.get_part(name)


def is_shipped(name: str) -> bool:
    """Whether ``name`` is one of fedsim's own mechanisms (its class is defined in fedsim, not
    in a plugin): its noise stream is covered by fedsim's tests."""
    return name in MECHANISMS and type(MECHANISMS[name]).__module__.startswith("fedsim.privacy.mechanisms.")


def is_correlated(name: str) -> bool:
    """Whether ``name`` is a matrix-factorization (correlated-noise) mechanism."""
    return name in MECHANISMS and MECHANISMS[name].correlated


def options_of(name: str, **values: Any) -> MechanismOptions:
    """The validated options of mechanism ``name`` from keyword values (None values are left out,
    so they take the defaults); a key the mechanism does not take is a :class:`FedsimError`."""
    mech = get_mechanism(name)
    given = {k: v for k, v in values.items() if v is not None}
    try:
        return mech.options.model_validate({"mechanism": name, **given})
    except ValidationError as e:
        allowed = sorted(set(mech.options.model_fields) - {"mechanism"})
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
        raise FedsimError(f"mechanism {name!r}: {problems} (its options: {', '.join(allowed) or 'none'})") from None
