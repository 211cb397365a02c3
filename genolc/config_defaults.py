"""Command-line defaults read from the config dataclasses, so that each default is written once: in its config.

A command's option says ``default=config_default(TrainConfig, "lr")`` rather than repeating ``3e-4``;
``tests/test_cli_defaults.py`` checks every option that sets a config field this way.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Callable


def config_default(config: type, name: str, as_text: Callable[[Any], str] | None = None) -> Any:
    """The default of ``config``'s field ``name``; ``as_text`` spells it as the option is typed (e.g. 65536 as
    ``64k`` with :func:`genolc.units.format_length`), for options parsed from text."""
    fields = {field.name: field for field in dataclasses.fields(config)}
    if name not in fields:
        raise KeyError(f"{config.__name__} has no field {name!r}")
    field = fields[name]
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        raise KeyError(f"{config.__name__}.{name} has no default")
    return as_text(value) if as_text is not None else value


def config_option(config: type, *decls: str, as_text: Callable[[Any], str] | None = None,
                  **kwargs: Any) -> Callable[[Callable], Callable]:
    """``click.option(*decls, **kwargs)`` for the ``config`` field the option sets (its parameter name: a bare word in
    ``decls``, else the first long flag with dashes as underscores), defaulting to that field's default, shown in
    ``--help``; an int or float field also gives the option its type. ``as_text`` as in :func:`config_default`."""
    import click

    name = next((d for d in decls if not d.startswith("-")), None)
    if name is None:
        flag = next(d for d in decls if d.startswith("--"))
        name = flag.split("/")[0][2:].replace("-", "_")
    kwargs.setdefault("default", config_default(config, name, as_text))
    kwargs.setdefault("show_default", True)
    field_type = typing.get_type_hints(config).get(name)
    if as_text is None and field_type in (int, float) and "type" not in kwargs and not kwargs.get("is_flag"):
        kwargs["type"] = field_type
    return click.option(*decls, **kwargs)
