"""Other formats: Hugging Face transformers and keras-hub presets."""

import os

from kroberta.errors import InputError

EXPORT_FORMATS = ("hf", "keras-hub")  # `kroberta.training.final_model.export`'s formats


def check_out_dir(out_dir: str, overwrite: bool, name: str = "out_dir") -> bool:
    """Refuses an `out_dir` that is a file, or a non-empty directory unless `overwrite`
    (an export must not mix into, or replace, files it did not write); returns whether
    it holds files. `name`: the argument the messages name."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise InputError(f"{name} {out_dir}: exists and is not a directory")
    non_empty = os.path.isdir(out_dir) and bool(os.listdir(out_dir))
    if non_empty and not overwrite:
        raise InputError(f"{name} {out_dir}: directory is not empty (pass --overwrite, "
                         "overwrite=True in Python, to replace its export)")
    return non_empty


def clear_export(out_dir: str, overwrite: bool, files) -> None:
    """`check_out_dir`, then the `files` a previous export wrote there are removed, so
    e.g. a stale tokenizer cannot survive the new export."""
    if check_out_dir(out_dir, overwrite):
        for name in files:
            path = os.path.join(out_dir, name)
            if os.path.isfile(path):
                os.remove(path)
