"""Expanding the file names and globs a command is given, before TensorFlow is imported.

Local patterns are matched with Python's glob, so a missing or mistyped path is named
at once; an object store's (gs://...) through `kroberta.storage` (fsspec). A run's data
section is found here once (`find_sources`: a prepared directory's manifest read and its
files matched, or the patterns expanded), and the pipelines read what it found.
"""

import dataclasses
import os

from kroberta import storage
from kroberta.config import DataConfig
from kroberta.data.manifest import Manifest, load_manifest
from kroberta.errors import ConfigError, InputError
from kroberta.run_layout import MANIFEST_NAME
from kroberta.storage import is_url


def resolve_files(patterns, key: str) -> tuple[str, ...]:
    """Expands files and globs in order; an unmatched pattern is an error naming `key`."""
    files = []
    for pattern in patterns:
        # Sorted; hidden files match a `*` as TensorFlow's glob matches them.
        matched = storage.glob(pattern, include_hidden=True)
        if not matched:
            looks_like_text = " " in pattern and "/" not in pattern
            hint = (
                "; it reads as text, not a path: kroberta.fill_mask(model, texts) fills "
                "the <mask> in sentences"
                if looks_like_text
                else ""
            )
            raise InputError(f"{key}: no file matches {pattern!r}{hint}")
        # Local paths only: a stat per shard of an object store would slow every start.
        for path in (p for p in matched if not is_url(p) and os.path.isdir(p)):
            # What to give instead: its files, or for training a prepared directory's data.dir.
            if os.path.isfile(os.path.join(path, MANIFEST_NAME)):
                raise InputError(
                    f"{key}: {path} is a directory made by prepare: training takes "
                    f"it as --data.dir={path}; elsewhere name its files, e.g. "
                    f"'{os.path.join(path, 'validation-*.tfrecord')}'"
                )
            raise InputError(
                f"{key}: {path} is a directory; name its TFRecord files, e.g. "
                f"'{os.path.join(path, '*.tfrecord')}' (text goes through python -m "
                "kroberta.prepare first)"
            )
        files.extend(m for m in matched if m not in files)
    return tuple(files)


@dataclasses.dataclass(frozen=True)
class DataSources:
    """The files a run's data section names, found once. With `manifest`: a prepared
    directory's (`directory` as the config key `key` named it); without: explicit files,
    or none at all (the embedded corpus, prepared later)."""

    train: tuple[str, ...]
    validation: tuple[str, ...]
    manifest: Manifest | None = None
    directory: str | None = None
    key: str | None = None


def find_sources(data: DataConfig) -> DataSources:
    """data.dir's manifest read and its files matched, or data.train's and
    data.validation's patterns expanded; nothing when the section names no data."""
    if data.dir:
        return prepared_sources(data.dir, "data.dir", data.validation)
    if not data.train:
        return DataSources((), ())
    return DataSources(
        resolve_files(data.train, "data.train"), resolve_files(data.validation, "data.validation")
    )


def prepared_sources(directory: str, key: str, validation=()) -> DataSources:
    """The sources of prepared `directory` (named by config key `key`); its validation
    files, or `validation`'s patterns when it has none."""
    if not is_url(directory) and not os.path.isdir(directory):  # a URL: the manifest says
        raise ConfigError(
            f"{key}: {directory} is not a directory; give the --out of python -m kroberta.prepare"
        )
    manifest = load_manifest(directory)
    return DataSources(
        resolve_files(manifest.train_files, "data.train"),
        resolve_files(tuple(manifest.validation_files) or validation, "data.validation"),
        manifest,
        directory,
        key,
    )
