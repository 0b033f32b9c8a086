"""`manifest.json`: what `prepare` wrote, read back by training and `--check`.

The manifest is written last, so its presence means the directory is complete.
A directory on a URL (gs://, any fsspec filesystem) is read through `kroberta.storage`;
the record files themselves are read by tf.data.
"""

import dataclasses
import json
import os

from kroberta.atomic import atomic_write
from kroberta.errors import InputError
from kroberta.run_layout import MANIFEST_NAME
from kroberta.storage import is_url, isfile, join, read_text

FORMAT = "kroberta-tfrecord-v1"
_REQUIRED = (
    "format",
    "train",
    "validation",
    "vocabulary_size",
    "sequence_length",
    "special_tokens",
    "tokenizer",
)
_SPECIALS = ("bos", "pad", "eos", "unk", "mask")


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A prepared data directory; file paths are absolute."""

    dir: str
    train_files: tuple
    validation_files: tuple
    train_sequences: int
    validation_sequences: int
    train_tokens: int
    validation_tokens: int
    vocabulary_size: int
    sequence_length: int
    special_tokens: dict  # {"bos": 0, "pad": 1, "eos": 2, "unk": 3, "mask": 4}
    tokenizer_path: str
    labels: str | None  # "static" when records carry fixed labels, else None
    mask_rate: float
    source: dict

    @property
    def files(self):
        """Every record file, train first."""
        return self.train_files + self.validation_files


def _split(data, key, path, base):
    section = data[key]
    _require(
        section,
        ("files", "sequences", "tokens"),
        path,
        f"key {key!r} must be an object, got {type(section).__name__}",
        lambda sub: f"{key}.{sub}",
    )
    files = section["files"]
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise InputError(f"{path}: key {key}.files must be a list of file names")
    resolved = tuple(join(base, f) for f in files)
    for name, full in zip(files, resolved):
        if not isfile(full):
            raise InputError(f"{path}: {key}.files lists {name}, which does not exist ({full})")
    return (
        resolved,
        _int(section, "sequences", path, f"{key}.sequences"),
        _int(section, "tokens", path, f"{key}.tokens"),
    )


def _int(section, key, path, label=None):
    value = section[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(
            f"{path}: key {label or key} must be a non-negative integer, got {value!r}"
        )
    return value


def _require(obj, keys, path, not_an_object: str, label):
    """`obj` is a JSON object holding every key of `keys` (named by `label(key)`)."""
    if not isinstance(obj, dict):
        raise InputError(f"{path}: {not_an_object}")
    for key in keys:
        if key not in obj:
            raise InputError(f"{path}: missing key {label(key)}")


def load_manifest(directory):
    """Read and validate `directory/manifest.json`.

    Args:
        directory: a directory written by `prepare`.

    Returns:
        A frozen `Manifest` with absolute paths. Raises `InputError` naming the
        file or key on any problem.
    """
    directory = os.fspath(directory)
    base = directory.rstrip("/") if is_url(directory) else os.path.abspath(directory)
    path = join(base, MANIFEST_NAME)
    if not isfile(path):
        raise InputError(
            f"no {MANIFEST_NAME} in {base} (prepare one with `python -m kroberta.prepare`)"
        )
    try:
        data = json.loads(read_text(path))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: malformed JSON ({e})") from None
    _require(data, _REQUIRED, path, "expected a JSON object at the top level", repr)
    if data["format"] != FORMAT:
        raise InputError(f"{path}: format is {data['format']!r}, expected {FORMAT!r}")
    specials = data["special_tokens"]
    _require(
        specials,
        _SPECIALS,
        path,
        "key 'special_tokens' must be an object",
        lambda name: f"special_tokens.{name}",
    )
    for name in _SPECIALS:
        _int(specials, name, path, f"special_tokens.{name}")
    tokenizer_path = join(base, str(data["tokenizer"]))
    if not isfile(tokenizer_path):
        raise InputError(f"{path}: tokenizer {data['tokenizer']} does not exist ({tokenizer_path})")
    train = _split(data, "train", path, base)
    validation = _split(data, "validation", path, base)
    if not train[0]:
        raise InputError(f"{path}: key train.files is empty")
    labels = data.get("labels")
    if labels not in (None, "static"):
        raise InputError(f"{path}: key 'labels' must be \"static\" or null, got {labels!r}")
    mask_rate = data.get("mask_rate", 0.15)
    if isinstance(mask_rate, bool) or not isinstance(mask_rate, (int, float)):
        raise InputError(f"{path}: key 'mask_rate' must be a number, got {mask_rate!r}")
    return Manifest(
        dir=base,
        train_files=train[0],
        validation_files=validation[0],
        train_sequences=train[1],
        validation_sequences=validation[1],
        train_tokens=train[2],
        validation_tokens=validation[2],
        vocabulary_size=_int(data, "vocabulary_size", path),
        sequence_length=_int(data, "sequence_length", path),
        special_tokens={name: specials[name] for name in _SPECIALS},
        tokenizer_path=tokenizer_path,
        labels=labels,
        mask_rate=float(mask_rate),
        source=data.get("source", {}),
    )


def write_manifest(directory, data):
    """Write `directory/manifest.json` atomically (a crash leaves no partial manifest)."""
    path = os.path.join(os.fspath(directory), MANIFEST_NAME)
    with atomic_write(path, encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    return path


def check_prepared_with(
    directories,
    key: str,
    vocabulary_size: int,
    tokenizer=None,
    *,
    positions: int | None = None,
    holder: str = "model",
    named: str = "the model",
    tokenizer_owner: str = "model",
    tokenizer_source: str = "MODEL_DIR",
    required: bool = False,
):
    """Refuses prepared data that are not a model's: ids of another tokenizer would be
    read as other tokens (a wrong number, no error), and longer sequences do not fit.

    Args:
        directories: the directories holding the data's files. One without a (readable)
            manifest is skipped, as nothing says which tokenizer wrote its ids, unless
            `required` (then its `load_manifest` error is raised).
        key: the config key or argument that named the data; the message starts with it.
        vocabulary_size: the model's (or checkpoint's).
        tokenizer: its `tokenizers.Tokenizer`, or None to compare the sizes only.
        positions: its max_sequence_length, or None not to compare sequence lengths.
        holder: the model's kind in the message: "model" or "checkpoint".
        named: the model in the message ("this model", "the checkpoint (init_from_hf=DIR)").
        tokenizer_owner: whose tokenizer to prepare with ("run", "model", "checkpoint").
        tokenizer_source: what to give `python -m kroberta.prepare --tokenizer`.

    Raises:
        InputError naming the directory, the difference and the `prepare` command.
    """
    # start-up: tokenizers loads only to compare two tokenizers
    from tokenizers import Tokenizer

    for directory in directories:
        try:
            manifest = load_manifest(directory)
        except InputError:
            if required:
                raise
            continue
        fix = f"python -m kroberta.prepare --tokenizer {tokenizer_source} ..."
        if positions is not None:
            fix = fix.replace(" ...", f" --seq-len {min(manifest.sequence_length, positions)} ...")
        # Ids from another tokenizer mean other tokens to the model, with no error.
        differs = None
        if manifest.vocabulary_size != vocabulary_size:
            differs = (
                f"a vocabulary of {manifest.vocabulary_size} tokens; the {holder} has "
                f"{vocabulary_size}"
            )
        elif (
            tokenizer is not None
            and Tokenizer.from_str(read_text(manifest.tokenizer_path)).get_vocab()
            != tokenizer.get_vocab()
        ):
            differs = f"another tokenizer than the {holder}'s (other tokens at the same ids)"
        if differs is not None:
            raise InputError(
                f"{key}: {directory} was prepared with {differs}, so its ids mean other tokens "
                f"to {named}; prepare the text with the {tokenizer_owner}'s tokenizer ({fix})"
            )
        if positions is not None and manifest.sequence_length > positions:
            raise InputError(
                f"{key}: {directory} holds sequences of {manifest.sequence_length} tokens, but "
                f"{named} has {positions} positions; prepare the text again with --seq-len "
                f"{positions} ({fix})"
            )
