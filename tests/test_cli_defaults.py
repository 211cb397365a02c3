"""Each command-line default is written once, in its config dataclass: an option that sets a config field shows and
passes that field's default, and follows it when the config's default changes."""

from __future__ import annotations

import dataclasses
import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import click

from genolc.cli import COMMANDS
from genolc.units import parse_length


def _lengths(text: str | None) -> tuple[int, ...]:
    return tuple(parse_length(part) for part in text.split(",")) if text else ()


def _chunk(text: str) -> int | None:
    # Imported when called: the subprocess below changes the configs before any command module is imported.
    from genolc.train.command import parse_chunk

    return parse_chunk(text)


# command -> the config classes its options fill (module, class), options named unlike their field (option -> field)
# and how an option's text becomes the field's value where it is not a plain length or the value itself.
CONFIGS: dict[str, list[tuple[str, str]]] = {
    "prepare": [("genolc.data.prepare", "PrepareConfig")],
    "finetune": [("genolc.train.config", "TrainConfig")],
    "eval": [("genolc.eval.config", "EvalInputs"), ("genolc.eval.config", "ByPositionConfig"),
             ("genolc.eval.config", "NeedleConfig"), ("genolc.eval.config", "RoutingConfig")],
    "score": [("genolc.score.run", "ScoreConfig")],
    "embed": [("genolc.score.run", "EmbedConfig")],
    "demo": [("genolc.demo.config", "DemoConfig")],
}
FIELD_OF: dict[str, dict[str, str]] = {
    "eval": {"needle_bases": "segment_bases", "needle_trials": "trials", "needle_distances": "distances",
             "routing_group": "group_tokens"},
    "score": {"window": "window_labels"},
    "embed": {"chunk": "window_chunk"},
}
AS_VALUE: dict[tuple[str, str], Callable[[Any], Any]] = {
    ("finetune", "chunk"): _chunk,
    ("finetune", "seq_warmup"): _lengths,
    ("score", "window"): lambda text: (text,),
}
# Options whose default is not the config's on purpose (the reason beside each).
NOT_THE_CONFIGS: dict[tuple[str, str], str] = {
    ("finetune", "model"): "None tells --model from --init; the command then uses TrainConfig.model",
    ("eval", "out"): "genolc-eval-<time>, genolc-needle-<time> or genolc-routing-<time> by mode",
    ("eval", "seq"): "required: the window is the user's choice",
    ("finetune", "seq"): "required: the window is the user's choice",
    ("score", "windows"): "None: the one --window",
}


def _config_fields(command: str) -> list[tuple[type, dict[str, dataclasses.Field]]]:
    classes = [getattr(importlib.import_module(module), name) for module, name in CONFIGS[command]]
    return [(cls, {f.name: f for f in dataclasses.fields(cls)}) for cls in classes]


def _field_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _as_value(command: str, option: click.Option, wanted: Any) -> Any:
    """The option's default as its command hands it to the config."""
    value = option.to_info_dict()["default"]  # what --help shows and the command receives (None when unset)
    if (command, option.name) in AS_VALUE:
        return AS_VALUE[command, option.name](value)
    if option.multiple and value is None:
        return ()
    if isinstance(value, str) and isinstance(wanted, int) and not isinstance(wanted, bool):
        return parse_length(value)
    return value


def mapped_options() -> list[tuple[str, click.Option, type, str]]:
    """(command, option, config class, field) for every option that sets a config field that has a default."""
    rows = []
    for command in sorted(CONFIGS):
        module, attribute, _ = COMMANDS[command]
        for option in getattr(importlib.import_module(module), attribute).params:
            if not isinstance(option, click.Option) or (command, option.name) in NOT_THE_CONFIGS:
                continue
            name = FIELD_OF.get(command, {}).get(option.name, option.name)
            for cls, fields in _config_fields(command):
                if name in fields and _field_default(fields[name]) is not dataclasses.MISSING:
                    rows.append((command, option, cls, name))
    return rows


def mismatches(*, flags: bool = True) -> list[str]:
    """Options whose default is not their field's; ``flags=False`` leaves out on-only flags (--force: absent is
    False whatever the config says)."""
    found = []
    for command, option, cls, name in mapped_options():
        if not flags and option.is_flag and not option.secondary_opts:
            continue
        wanted = _field_default({f.name: f for f in dataclasses.fields(cls)}[name])
        got = _as_value(command, option, wanted)
        if got != wanted:
            found.append(f"genolc {command} {option.opts[-1]}: default {got!r}, "
                         f"{cls.__name__}.{name} = {wanted!r}")
    return found


def _moved(value: Any) -> Any:
    """A different default of the same kind, for the test that options follow their config."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2 + 3
    if isinstance(value, float):
        return value + 0.25
    if isinstance(value, str):
        return value + "-moved"
    if isinstance(value, Path):
        return Path(f"{value}-moved")
    if isinstance(value, tuple) and value and all(isinstance(v, str) for v in value):
        return tuple(v + "-moved" for v in value)
    return value


def move_config_defaults() -> None:
    """Change every config default an option maps to, before any command module is imported."""
    moved: set[int] = set()
    for command in CONFIGS:
        for cls, fields in _config_fields(command):
            for name, field in fields.items():
                if field.default is not dataclasses.MISSING:
                    if id(field) not in moved:  # a subclass shares its base's field objects
                        moved.add(id(field))
                        field.default = _moved(field.default)
                    setattr(cls, name, field.default)


def test_every_option_that_sets_a_config_field_defaults_to_the_field():
    rows = mapped_options()
    assert len(rows) > 60, [f"{c} {o.name}" for c, o, _, _ in rows]
    assert not mismatches()
    for command in ("prepare", "finetune", "eval", "score", "embed", "demo"):
        assert any(c == command for c, *_ in rows), command


def test_options_follow_their_configs_defaults():
    """With every config default changed before the commands are imported, every mapped option shows the new one
    (a default written again in a click option would keep the old value)."""
    code = (f"import importlib.util, json, sys\n"
            f"spec = importlib.util.spec_from_file_location('cli_defaults', {str(Path(__file__))!r})\n"
            "tests = importlib.util.module_from_spec(spec); spec.loader.exec_module(tests)\n"
            "tests.move_config_defaults()\n"
            "print(json.dumps({'mapped': len(tests.mapped_options()), 'mismatches': tests.mismatches(flags=False)}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["mapped"] > 60 and not result["mismatches"], "\n".join(result["mismatches"])
