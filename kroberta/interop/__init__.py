"""Other formats: Hugging Face transformers and keras-hub presets."""

import contextlib
import os
import shutil
import tempfile

from kroberta.atomic import umask
from kroberta.errors import ArgumentKindError, InputError
from kroberta.run_layout import OUTPUT_MARKERS, marked_output

# `python -m kroberta.export`'s formats, each `run_layout.OUTPUT_MARKERS`' key of its export.
EXPORT_FORMATS = ("hf", "keras-hub")
# Other kroberta outputs an export into a directory would mix with or replace.
_NOT_EXPORTS = ("classifier", "run", "checkpoints", "prepared data")


def check_out_dir(out_dir, overwrite: bool, name: str, format: str) -> bool:
    """Refuses an `out_dir` that is a file, or a non-empty directory unless `overwrite`
    (an export must not mix into, or replace, files it did not write), and even then one
    that holds no `format` export (a run, a run's subfolder, prepared data, the other
    format's export); returns whether it holds files. `name`: the argument the messages
    name."""
    if not isinstance(out_dir, (str, os.PathLike)) or not os.fspath(out_dir):
        raise ArgumentKindError(f"{name}: expected a directory's path, got {out_dir!r}")
    out_dir = os.fspath(out_dir)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise InputError(f"{name} {out_dir}: exists and is not a directory")
    non_empty = os.path.isdir(out_dir) and bool(os.listdir(out_dir))
    if non_empty and not overwrite:
        raise InputError(
            f"{name} {out_dir}: directory is not empty (pass --overwrite, "
            "overwrite=True in Python, to replace its export)"
        )
    if non_empty:
        # Neither format writes the other's marker.
        others = [other for other in EXPORT_FORMATS if other != format]
        held = marked_output(out_dir, (*_NOT_EXPORTS, *others))
        if held:
            raise InputError(
                f"{name} {out_dir}: holds {held[1]} ({held[0]}), which an export "
                "must not replace; export into a directory of its own"
            )
        marker, kind = OUTPUT_MARKERS[format]
        if not os.path.exists(os.path.join(out_dir, marker)):
            raise InputError(
                f"{name} {out_dir}: holds files, but not {kind} ({marker} is "
                "missing); --overwrite replaces an export of the same format only: "
                "export into a directory of its own"
            )
    return non_empty


def check_tokenizer(tokenizer, function: str):
    """Refuses a `tokenizer` argument that is not a `tokenizers.Tokenizer` (or None)."""
    # start-up: commands read this package's names before tokenizers loads
    from tokenizers import Tokenizer

    if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
        raise ArgumentKindError(
            f"{function}: tokenizer: expected a tokenizers.Tokenizer (the model's own is "
            f"model.tokenizer; a file: tokenizers.Tokenizer.from_file(path)) or None, got "
            f"{type(tokenizer).__name__}"
            + (
                " (overwrite is passed by name: overwrite=True)"
                if isinstance(tokenizer, bool)
                else ""
            )
        )


def checked_export(model, tokenizer, out_dir, function: str, head: str) -> tuple[bool, object]:
    """Refuses, before any work, a `model` `function` cannot export (`head`: the class a
    classifier becomes) and a `tokenizer` that is none; returns (whether `model` is a
    classifier, the tokenizer to write: `tokenizer`, else the model's own, or None)."""
    # start-up: commands read this package's names before NumPy and Keras load
    from kroberta.interop import hf_weights
    from kroberta.model.masked_lm import check_model

    classifier = hf_weights.is_classifier(model)
    if classifier:
        hf_weights.check_first_token_head(model, function, head)
    else:
        check_model(model, function, out_dir, f"kroberta.{function}(model, out_dir)")
    check_tokenizer(tokenizer, function)
    return classifier, getattr(model, "tokenizer", None) if tokenizer is None else tokenizer


@contextlib.contextmanager
def staged_export(out_dir: str, overwrite: bool, files, format: str):
    """Yields an empty directory beside `out_dir` to write a `format` export into; once
    the export is whole it becomes `out_dir`. An interrupted or failed export leaves
    `out_dir` as it was (a previous export included); with `overwrite`, the files of
    `out_dir` that an export does not write (`files`) are kept."""
    non_empty = check_out_dir(out_dir, overwrite, "out_dir", format)
    out_dir = os.path.abspath(out_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(
        prefix=f".{os.path.basename(out_dir)}.", suffix=".partial", dir=parent
    )
    # mkdtemp's directory is its owner's only; the export gets the mode a directory made
    # here would have (or the one it replaces has).
    if os.path.isdir(out_dir):
        shutil.copymode(out_dir, staging)
    else:
        os.chmod(staging, 0o777 & ~umask())
    previous = staging + ".previous"
    try:
        yield staging
        if non_empty:
            written = {name.split("/")[0] for name in files}  # "assets/tokenizer/..." -> "assets"
            for name in set(os.listdir(out_dir)) - written - set(os.listdir(staging)):
                source = os.path.join(out_dir, name)
                copy = shutil.copytree if os.path.isdir(source) else shutil.copy2
                copy(source, os.path.join(staging, name))
        if os.path.isdir(out_dir):
            os.rename(out_dir, previous)
        os.rename(staging, out_dir)
    except BaseException:
        if os.path.isdir(previous) and not os.path.exists(out_dir):
            os.rename(previous, out_dir)  # interrupted between the two renames
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        shutil.rmtree(previous, ignore_errors=True)
    finally:  # a Ctrl-C while it is removed: the export is in place, its leftover goes too
        shutil.rmtree(previous, ignore_errors=True)
