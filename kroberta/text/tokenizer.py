"""Byte-level BPE tokenizer, trained and saved like RoBERTa's (a single tokenizer.json).

Byte-level means every string is representable (no `<unk>` in practice) and decoding
reproduces the input exactly, which `prepare`'s round-trip test relies on.
"""

import json
import os
import warnings

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from kroberta.atomic import atomic_write
from kroberta.errors import InputError
from kroberta.storage import isdir, isfile, read_text
from kroberta.tokens import SPECIAL_TOKENS  # in id order: <s>=0, <pad>=1, </s>=2, <unk>=3, <mask>=4

MIN_VOCABULARY_SIZE = len(SPECIAL_TOKENS) + 256  # the special tokens and the 256 bytes


class VocabularyShortfallWarning(UserWarning):
    """The corpus supported fewer BPE merges than the requested vocabulary size."""


def _special_added_tokens():
    # RoBERTa's <mask> strips the space before it, so "The <mask> sat" gives
    # ["The", "<mask>", "Ġsat"] and the model predicts "Ġcat" (with its space).
    return [
        AddedToken(text, lstrip=(name == "mask"), rstrip=False, normalized=False, special=True)
        for name, text in SPECIAL_TOKENS.items()
    ]


def train_tokenizer(text_iterator, vocab_size, out_path=None, min_frequency=2):
    """A RoBERTa-style byte-level BPE tokenizer trained on the streamed documents of
    `text_iterator`, `vocab_size` tokens at most (specials and the 256 bytes included;
    `prepare` checks it); saved to `out_path` unless None. Merges must occur
    `min_frequency` times (2: no one-off strings as tokens). When the data supports
    fewer tokens, a `VocabularyShortfallWarning` says how many were learned."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=_special_added_tokens(),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,  # prepare draws its own progress bar (bytes, MB/s)
    )
    tokenizer.train_from_iterator(text_iterator, trainer=trainer)
    if note := shortfall_note(tokenizer, vocab_size):
        warnings.warn(note, VocabularyShortfallWarning, stacklevel=2)
    if out_path is not None:
        save_tokenizer(tokenizer, out_path)
    return tokenizer


def save_tokenizer(tokenizer, path):
    """`tokenizer.save(path)` (the same bytes), written atomically, and failing with the
    OSError of the write (`tokenizers` raises a bare Exception that names no file)."""
    with atomic_write(path, encoding="utf-8") as f:
        f.write(tokenizer.to_str(pretty=True))


def shortfall_note(tokenizer, vocab_size):
    """What to say when the data supported fewer tokens than `vocab_size` (else None)."""
    learned = tokenizer.get_vocab_size(with_added_tokens=True)
    if learned < vocab_size:
        return (
            f"the data supports only {learned} tokens (requested vocab_size={vocab_size}); "
            f"using {learned}: the model's vocabulary_size must equal the manifest's ({learned})"
        )
    return None


TOKENIZER_FILE = "tokenizer.json"
HF_VOCABULARY_FILE, HF_MERGES_FILE = "vocab.json", "merges.txt"
HF_TOKENIZER_CONFIG = "tokenizer_config.json"
KERAS_HUB_VOCABULARY_FILE = "assets/tokenizer/vocabulary.json"
KERAS_HUB_MERGES_FILE = "assets/tokenizer/merges.txt"
ACCEPTED = (
    "a tokenizer.json, a Hugging Face model directory (tokenizer.json, or vocab.json + merges.txt) "
    "or a keras-hub preset directory (assets/tokenizer/vocabulary.json + merges.txt)"
)


def tokenizer_json_of(path):
    """The `tokenizers` JSON file `path` names: `path` itself when it is a file, the
    tokenizer.json inside it when it is a directory holding one; None otherwise. A
    keras-hub preset's tokenizer.json is a Keras layer config, not such a file: its
    tokenizer is in assets/tokenizer/."""
    path = os.fspath(path)
    if isdir(path):
        inside = path.rstrip("/") + "/" + TOKENIZER_FILE
        keras_hub = isfile(path.rstrip("/") + "/" + KERAS_HUB_VOCABULARY_FILE)
        return inside if isfile(inside) and not keras_hub else None
    return path if isfile(path) else None


def load_tokenizer(path):
    """The `tokenizers.Tokenizer` at `path` (any of `ACCEPTED`), checked for the five
    special tokens; on the same text its ids equal those of the Hugging Face (or
    keras-hub preset's) tokenizer it was read from."""
    path = os.fspath(path)
    json_path = tokenizer_json_of(path)
    if json_path is None:
        if isdir(path):
            return _directory_tokenizer(path)
        raise InputError(f"tokenizer not found: {path}; expected {ACCEPTED}")
    try:
        tokenizer = Tokenizer.from_str(read_text(json_path))
    except Exception as e:  # the library raises a bare Exception on malformed JSON
        raise InputError(
            f"{json_path}: cannot read this tokenizer: damaged or not a tokenizer's JSON ({e})"
        ) from None
    special_token_ids(tokenizer, source=json_path)
    return tokenizer


def _directory_tokenizer(directory):
    """A keras-hub preset's assets/tokenizer/vocabulary.json + merges.txt, or a Hugging Face
    directory's vocab.json + merges.txt (without tokenizer.json)."""
    directory = directory.rstrip("/")
    for vocabulary, merges in (
        (KERAS_HUB_VOCABULARY_FILE, KERAS_HUB_MERGES_FILE),
        (HF_VOCABULARY_FILE, HF_MERGES_FILE),
    ):
        vocabulary, merges = f"{directory}/{vocabulary}", f"{directory}/{merges}"
        if isfile(vocabulary) and isfile(merges):
            return byte_level_bpe(vocabulary, merges, _add_prefix_space(directory))
    raise InputError(f"{directory}: no tokenizer in this directory; expected {ACCEPTED}")


def _add_prefix_space(directory):
    """A Hugging Face tokenizer_config.json's add_prefix_space (transformers' default: False)."""
    path = f"{directory}/{HF_TOKENIZER_CONFIG}"
    if not isfile(path):
        return False
    try:
        return bool(json.loads(read_text(path)).get("add_prefix_space", False))
    except (ValueError, AttributeError) as e:
        raise InputError(f"cannot read {path}: {e}") from None


def byte_level_bpe(vocabulary, merges, add_prefix_space=False):
    """RoBERTa's tokenizer from a vocabulary and merges file, as `transformers` builds it
    (its RobertaTokenizer): byte-level BPE, `<s> ... </s>` around a text, the special
    tokens at their ids in the vocabulary, `<mask>` taking the space before it.

    `vocabulary` maps token to id (Hugging Face's vocab.json, keras-hub's
    vocabulary.json); `add_prefix_space` as tokenizer_config.json says. InputError
    when a file cannot be read or a special token is missing.
    """
    vocabulary, merges = os.fspath(vocabulary), os.fspath(merges)
    try:
        # Read as text (kroberta.storage: a gs:// directory too) and parsed as `BPE.from_file`
        # parses the files: merges.txt's "a b" lines after its "#version" line.
        lines = read_text(merges).split("\n")
        lines = lines[:-1] if lines[-1] == "" else lines  # a final newline ends the last line
        pairs = [
            tuple(line.removesuffix("\r").split(" "))
            for line in lines
            if not line.startswith("#version")
        ]
        model = models.BPE(json.loads(read_text(vocabulary)), pairs)
    except Exception as e:  # the library raises a bare Exception on malformed files
        raise InputError(f"cannot read {vocabulary} + {merges}: {e}") from None
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [t for t in _special_added_tokens() if tokenizer.token_to_id(t.content) is not None]
    )
    ids = special_token_ids(tokenizer, source=vocabulary)
    tokenizer.post_processor = processors.RobertaProcessing(
        (SPECIAL_TOKENS["eos"], ids["eos"]),
        (SPECIAL_TOKENS["bos"], ids["bos"]),
        add_prefix_space=add_prefix_space,
    )
    return tokenizer


def special_token_ids(tokenizer, source=None):
    """Role -> id of the special tokens, e.g. {"bos": 0, "pad": 1, "eos": 2, "unk": 3,
    "mask": 4}; an InputError naming `source` (the tokenizer's path) when one is missing."""
    ids = {name: tokenizer.token_to_id(text) for name, text in SPECIAL_TOKENS.items()}
    missing = [SPECIAL_TOKENS[name] for name, i in ids.items() if i is None]
    if missing:
        where = f" {source}" if source else ""
        raise InputError(
            f"tokenizer{where} lacks the special token(s) {', '.join(missing)}; kroberta needs "
            + ", ".join(SPECIAL_TOKENS.values())
        )
    return ids


# Byte-level BPE writes a space as this character: a token that starts with it
# begins a word.
SPACE_MARKER = "\u0120"


def word_start_table(tokenizer, vocabulary_size: int):
    """(vocabulary_size,) bool numpy table: True for the ids whose token begins a word.

    The space-marked tokens (byte-level BPE's "Ġword"); whole-word masking also
    starts a word after any special token (the first word of a text has no space).
    """
    table = np.zeros(vocabulary_size, bool)
    for token, index in tokenizer.get_vocab(with_added_tokens=False).items():
        if index < vocabulary_size and token.startswith(SPACE_MARKER):
            table[index] = True
    return table


def vocabulary_size(tokenizer):
    """The embedding table size the tokenizer needs: largest id + 1."""
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    # Added tokens can sit above the model vocabulary; the table must cover them.
    top = max(tokenizer.get_added_tokens_decoder(), default=-1)
    return max(size, top + 1)
