"""The configs shipped inside the package, by name: `--config seed`, `load_config("seed")`.

They live in `kroberta/configs/*.toml` (package data), so they are there in any
install: editable, from a wheel or from PyPI. A `--config` value that is not a
shipped name is the path of a TOML file.
"""

import importlib.resources
import os
import re

from kroberta import config as config_lib
from kroberta.config import Config, ConfigError

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")  # no "/" and no ".": cannot be meant as a path
OVERRIDES = "overrides"  # how errors name the values given to load_config


def _shipped_dir():
    return importlib.resources.files("kroberta") / "configs"


def names() -> list[str]:
    """The shipped configs' names, sorted: ["base", "seed", "tiny"]."""
    return sorted(entry.name[: -len(".toml")] for entry in _shipped_dir().iterdir()
                  if entry.name.endswith(".toml"))


def resolve(name_or_path: str) -> str:
    """The TOML file a `--config` value means: a shipped config's name, else a path.

    Raises ConfigError naming the value and listing the shipped names when neither
    a shipped config nor a file of that name exists.
    """
    if _NAME.match(name_or_path):
        shipped = _shipped_dir() / f"{name_or_path}.toml"
        if shipped.is_file():
            return str(shipped)
    if os.path.isfile(name_or_path):
        return name_or_path
    raise ConfigError(
        f"config {name_or_path!r}: neither a shipped config ({', '.join(names())}) nor a "
        "file; give one of those names or the path of a TOML file")


def _nested(dotted: str, value) -> dict:
    parts = dotted.split(".")
    if len(parts) == 1:
        return {dotted: value}
    if len(parts) == 2:
        return {parts[0]: {parts[1]: value}}
    raise ConfigError(f"{OVERRIDES}: {dotted!r}: expected 'section.key' or a top-level key")


def load_config(name_or_path: str | None = None, overrides: dict | None = None) -> Config:
    """The config of a shipped name or TOML file, with overrides, validated.

    Args:
        name_or_path: "seed", "tiny", "base" (the shipped configs), the path of a TOML
            file, or None for the defaults (the embedded default job).
        overrides: {"section.key": value} with Python values, e.g.
            {"train.steps": 100, "data.dir": "data/x"}; a list field takes a list or
            one string.

    Returns:
        A validated `kroberta.config.Config`, ready for `kroberta.train(config)`.

    Raises:
        ConfigError: an unknown name, key, type or impossible value; the message
            names the key and where it was set, as on the command line.
    """
    path = resolve(name_or_path) if name_or_path else None
    config = config_lib.load_toml(path) if path else Config()
    sources = config_lib.sources(path, [])
    if overrides is not None and not isinstance(overrides, dict):
        raise ConfigError(f"{OVERRIDES}: expected a dict like {{'train.steps': 100}}, "
                          f"got {type(overrides).__name__}")
    for dotted, value in (overrides or {}).items():
        if not isinstance(dotted, str):
            raise ConfigError(f"{OVERRIDES}: keys are 'section.key' strings, got {dotted!r}")
        config = config_lib.apply_dict(config, _nested(dotted, value), OVERRIDES)
        sources[dotted] = OVERRIDES
    return config_lib.validate(config, sources)
