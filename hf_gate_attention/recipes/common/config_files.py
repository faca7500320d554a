"""Config files and command-line overrides read into a recipe's config dataclass: unknown keys named (with
the closest known one), values coerced to the fields' types."""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml

_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}
_KEY_VALUE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*=")  # an override of its own, not the value of a --key


def from_mapping(config_class, data: dict, source: str = "config"):
    """A config dataclass built from a mapping whose values may be strings (command line) or typed."""
    check_keys(data, source, config_class)
    hints = typing.get_type_hints(config_class)
    return config_class(**{key: _coerce(key, value, hints[key]) for key, value in data.items()})


def check_keys(data: dict, source: str, config_class) -> None:
    """Raise `ValueError` naming the first key of `data` that is not a field of `config_class`."""
    known = [f.name for f in dataclasses.fields(config_class)]
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown config key {key!r} in {source}{hint}; known keys: {', '.join(known)}")


def _coerce(key: str, value: Any, annotation) -> Any:
    """Convert `value` (command-line string or YAML/JSON value) to the field's type, or raise naming `key`."""
    options = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    if value is None or (isinstance(value, str) and value.lower() in ("null", "none")):
        if type(None) in options:
            return None
        raise ValueError(f"config key {key!r} may not be null")
    errors = []
    for option in (o for o in options if o is not type(None)):
        try:
            return _convert(value, option)
        except (TypeError, ValueError, yaml.YAMLError) as err:
            errors.append(str(err))
    raise ValueError(f"config key {key!r}: cannot read {value!r} as {annotation}: {'; '.join(errors)}")


def _convert(value: Any, target) -> Any:
    origin = typing.get_origin(target) or target
    if origin is bool:
        text = str(value).lower()
        if isinstance(value, bool) or text in _TRUE | _FALSE:
            return value if isinstance(value, bool) else text in _TRUE
        raise ValueError(f"expected true/false, got {value!r}")
    if origin is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(f"expected an integer, got {value!r}")
        return int(value)
    if origin is float:
        if isinstance(value, bool):
            raise ValueError(f"expected a number, got {value!r}")
        return float(value)
    if origin is str:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ValueError(f"expected a string, got {value!r}")
        return str(value)
    if origin is list:
        items = yaml.safe_load(value) if isinstance(value, str) else value
        if isinstance(items, str):  # comma-separated on the command line: q_proj,v_proj
            items = [item.strip() for item in items.split(",") if item.strip()]
        if not isinstance(items, list):
            raise ValueError(f"expected a list, got {value!r}")
        (item_type,) = typing.get_args(target)
        # runs (`RunSpec`, or another recipe's run dataclass) are read by the config's own __post_init__
        return items if dataclasses.is_dataclass(item_type) else [_convert(item, item_type) for item in items]
    raise TypeError(f"unsupported config type {target}")


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (YAML keeps the last without a word)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_config_file(path: str | Path) -> dict:
    """The mapping in a YAML or JSON config file."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"config file {str(path)!r} is a folder; expected a YAML or JSON file")
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"config file {str(path)!r} is not UTF-8 text ({err.reason} at byte {err.start}); expected "
            "a YAML or JSON file"
        ) from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=_UniqueKeyLoader)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        kind = "JSON" if path.suffix == ".json" else "YAML"
        raise ValueError(f"config file {str(path)!r} is not valid {kind}: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(
            f"config file {str(path)!r} must hold a mapping of config keys, got {type(data).__name__}"
        )
    return data


def parse_overrides(args: list[str]) -> dict[str, str]:
    """`["lr_key=v", "--other", "v2", "--last=v3", "--flag"]` -> `{"lr_key": "v", "other": "v2", "last": "v3",
    "flag": "true"}`.

    Overrides are `KEY=VALUE` or `--key value` (`--key=value`); dashes in key names are read as underscores;
    a `--key` without a value (followed by another `--key`, a `KEY=VALUE` or nothing) means `true`, so
    `--resume max_steps=9` resumes with max_steps 9 (a value that looks like `KEY=VALUE` is given as
    `--key=value`).
    """
    overrides, i = {}, 0
    while i < len(args):
        arg = args[i]
        key, has_value, value = arg.removeprefix("--").partition("=")
        if not key or (not arg.startswith("--") and not has_value):
            raise ValueError(f"expected KEY=VALUE or --key value, got {arg!r}")
        if not has_value:
            has_next = (
                i + 1 < len(args) and not args[i + 1].startswith("--") and not _KEY_VALUE.match(args[i + 1])
            )
            value = args[i + 1] if has_next else "true"
            i += has_next
        overrides[key.replace("-", "_")] = value
        i += 1
    return overrides


def load_config(path: str | Path | None, overrides: dict[str, Any] | None, config_class):
    """`config_class` from its defaults, then the file at `path`, then `overrides` (command line); unknown
    keys raise ValueError."""
    data = read_config_file(path) if path is not None else {}
    check_keys(data, f"config file {str(path)!r}", config_class)
    check_keys(overrides or {}, "the command line", config_class)
    return config_class.from_dict({**data, **(overrides or {})})
