"""Registries: the one list of each kind of pluggable part (docs/architecture.md).

Noise mechanisms (:mod:`fedsim.privacy.mechanisms`), server filters (:mod:`fedsim.server.filters`),
server optimizers (:mod:`fedsim.server.optim`), datasets (:mod:`fedsim.data`) and models
(:mod:`fedsim.models`) each have one :class:`Registry`. A part registers itself where it is
defined, with an options model (a :class:`ChoiceOptions`: the config keys that belong to it, with
the registry's key as a ``Literal`` discriminator). The config's choices and tables, the CLI's
choices and the docs tables are derived from the registries, never written out by hand.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from fedsim.errors import FedsimError, RegistryFrozen

T = TypeVar("T")


class ChoiceOptions(BaseModel):
    """Base of every part's options: unknown keys are errors, TOML types are exact (``"10"`` is
    not an int, ``true`` is not 1; ints are accepted for floats) and numbers must be finite."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False)


class Registry(dict[str, T]):
    """Name → registered part, in registration order.

    Parameters
    ----------
    kind : what is registered, for messages (e.g. ``"server filter"``).
    key : the config key that chooses one (e.g. ``"filter.name"``).
    """

    def __init__(self, kind: str, key: str) -> None:
        super().__init__()
        self.kind = kind
        self.key = key
        #: set once the config's schema is built from this registry (:meth:`freeze`)
        self.frozen = False

    def freeze(self) -> None:
        """The config's choices were built from this registry: a later part could not be named
        in a config, so :meth:`add` refuses it from now on (with a message saying when to
        register instead)."""
        self.frozen = True

    def add(self, name: str, part: T, options: type[BaseModel] | None = None) -> T:
        """Register ``part`` as ``name`` (a name can be registered once). ``options``: the part's
        options model, whose choosing key (the last part of :attr:`key`) must default to ``name``
        (it is the ``Literal`` the config's union is discriminated by)."""
        if name in self:
            raise FedsimError(f"{self.kind} {name!r} is registered twice; choose another name")
        if self.frozen:
            raise RegistryFrozen(
                f"{self.kind} {name!r} is registered after the config schema was built (fedsim.config was "
                f"imported, e.g. by a loaded config); register parts first: import your module before "
                f"loading any config"
            )
        field = self.key.rsplit(".", 1)[-1]
        if options is not None and (field not in options.model_fields or options.model_fields[field].default != name):
            raise ValueError(f"{options.__name__}.{field} must be Literal[{name!r}] with default {name!r}")
        self[name] = part
        return part

    def get_part(self, name: str) -> T:
        """The part registered as ``name``; a :class:`FedsimError` listing the names otherwise."""
        if name not in self:  # a process that has not read a config yet (a Ray worker): its plugins
            from fedsim.plugins import load_startup

            load_startup()
        try:
            return self[name]
        except KeyError:
            if not self:
                raise FedsimError(
                    f"{self.key} = {name!r} is unknown: no {self.kind} is registered; register it in a plugin "
                    f"(the config's plugins = [...], or $FEDSIM_PLUGINS) before the config is read, or drop {self.key}"
                ) from None
            raise FedsimError(f"{self.key} = {name!r} is unknown; use one of {', '.join(self)}") from None


def validate_options(model: type[BaseModel], values: dict[str, Any], what: str, table: str) -> Any:
    """``model`` validated from ``values`` (None values left out, so they take the defaults); a
    :class:`FedsimError` naming ``what``, the bad keys as ``<table>.<key>`` and the allowed keys
    otherwise."""
    given = {k: v for k, v in values.items() if v is not None}
    try:
        return model.model_validate(given)
    except ValidationError as e:
        problems = "; ".join(
            (f"{table}.{'.'.join(str(p) for p in err['loc'])}: " if err["loc"] else "")
            + err["msg"].removeprefix("Value error, ")
            for err in e.errors()
        )
        raise FedsimError(f"{what}: {problems} (its options: {', '.join(sorted(model.model_fields))})") from None
