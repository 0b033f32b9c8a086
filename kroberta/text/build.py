"""Building a prepared directory: raw text -> tokenizer -> packed TFRecord shards + manifest.json.

`prepare()` is `python -m kroberta.prepare` as a function (and what a run without
data builds from the embedded corpus; steps: `kroberta.cli.prepare`). Shards are written
atomically and the manifest last: a directory with a manifest is complete. An
`out_dir` on a URL (gs://, any fsspec filesystem: `kroberta.storage`) is prepared in
a local temporary directory, then uploaded with the manifest last.
"""

import contextlib
import logging
import math
import numbers
import os
import shutil
import tempfile
import time
import types
import warnings

import numpy as np

from kroberta import storage
from kroberta.atomic import atomic_path
from kroberta.data.manifest import FORMAT, MANIFEST_NAME, load_manifest, write_manifest
from kroberta.data.records import encode_examples
from kroberta.tokens import PAD_ID
from kroberta.errors import InputError, StorageError
from kroberta.text import locations
from kroberta.text.encode import blocks, encoded_documents
from kroberta.text.packing import one_per_document, pack_documents
from kroberta.text.progress import Progress
from kroberta.text.recordfiles import check_source
from kroberta.text.splits import SplitWriter, in_validation
from kroberta.text.textfiles import LONG_DOCUMENT_LINES, ReadCounts, Source, expand_inputs, iter_documents, scan_file
from kroberta.text.tokenizer import MIN_VOCABULARY_SIZE, TOKENIZER_FILE, VocabularyShortfallWarning, load_tokenizer, shortfall_note, special_token_ids, tokenizer_json_of, train_tokenizer, vocabulary_size

logger = logging.getLogger(__name__)

MIN_SEQ_LEN = 8
TARGET_SHARD_BYTES = 200e6  # shards of ~100-200 MB: few files, yet parallel reads
STEADY_VALIDATION = 100  # validation sequences below which prepare warns
BLOCK = 1024  # sequences per block: the unit of static masking and of serialization


class PrepareWarning(UserWarning):
    """Something was skipped or adjusted; recorded in the manifest too."""


def _check_arguments(vocab_size, seq_len, validation_fraction, labels, mask_rate, shards, tokenizer):
    # Python callers can pass anything: the types first, each named by its option.
    for option, value, kind in (("--vocab-size", vocab_size, numbers.Integral),
                                ("--seq-len", seq_len, numbers.Integral),
                                ("--validation-fraction", validation_fraction, numbers.Real),
                                ("--mask-rate", mask_rate, numbers.Real),
                                ("--shards", shards if shards is not None else 1, numbers.Integral)):
        if not isinstance(value, kind) or isinstance(value, bool):
            wanted = "an integer" if kind is numbers.Integral else "a number"
            raise InputError(f"{option} (prepare's {option[2:].replace('-', '_')}) must be "
                             f"{wanted}, got {value!r}")
    if seq_len < MIN_SEQ_LEN:
        raise InputError(f"--seq-len {seq_len} is too short: use at least {MIN_SEQ_LEN}")
    if tokenizer is None and vocab_size < MIN_VOCABULARY_SIZE:
        raise InputError(
            f"--vocab-size {vocab_size} is too small: byte-level BPE needs at least {MIN_VOCABULARY_SIZE} "
            "(5 special tokens + 256 bytes)"
        )
    if not 0 <= validation_fraction < 1:
        raise InputError(f"--validation-fraction must be in [0, 1), got {validation_fraction}")
    if labels not in (None, "static"):
        raise InputError(f"--labels must be 'static' or absent, got {labels!r}")
    if not 0 < mask_rate < 1:
        raise InputError(f"--mask-rate must be in (0, 1), got {mask_rate}")
    if shards is not None and shards < 1:
        raise InputError(f"--shards must be >= 1, got {shards}")


def _refuse_existing(out_dir, overwrite):
    """Refuse to clobber a prepared directory (local or a URL) unless asked, or to write
    into a file, before any work."""
    if storage.isfile(out_dir):
        raise InputError(f"--out {out_dir}: exists and is a file; give a directory to write "
                         "the prepared dataset into")
    path = storage.join(out_dir, MANIFEST_NAME)
    if storage.exists(path) and not overwrite:
        raise InputError(f"{out_dir} already holds a prepared dataset ({path}); pass "
                         "--overwrite (overwrite=True) to replace it")


def _clear_previous(out_dir):
    """Remove a previous prepared dataset's manifest and shards (after --overwrite)."""
    path = os.path.join(out_dir, MANIFEST_NAME)
    if not os.path.exists(path):
        return
    try:
        stale = load_manifest(out_dir).files
    except InputError:
        stale = ()
    os.remove(path)  # first: a crash from here on leaves no manifest pointing at mixed files
    for f in stale:
        storage.remove(f)


def _scan_inputs(files, strict, text_field, split):
    """Split the inputs into usable `Source`s and skipped text files (with reasons).

    A record file whose column, split or reader is missing is an error, not a skip:
    its documents cannot be read at all.
    """
    good, skipped, total, has_text = [], [], 0, False
    for path in files:
        source = Source.of(path, text_field, split)
        if source.format is not None:
            try:
                size = check_source(source.path, source.format, text_field, split)
            except OSError as e:
                raise InputError(f"{path}: unreadable ({e.strerror or e})") from None
            good.append(source)
            total += size
            # Empty records are known only once read (an all-empty corpus is refused then);
            # an empty file now, before a tokenizer is trained on nothing.
            has_text |= size > 0
            continue
        try:
            size, problem, offset, text = scan_file(path)
        except OSError as e:
            size, problem, offset, text = 0, f"unreadable ({e.strerror or e})", None, False
        if problem is None:
            good.append(source)
            total += size
            has_text |= text
            continue
        where = "" if offset is None else f" at byte {offset}"
        if strict:
            raise InputError(f"{path}: {problem}{where} (--strict)")
        warnings.warn(f"skipping {path}: {problem}{where}", PrepareWarning, stacklevel=3)
        skipped.append({"path": path, "problem": problem, "offset": offset})
    if not has_text:
        raise InputError(
            f"no text in the inputs: {len(files)} file(s), {len(skipped)} skipped, the rest empty or whitespace"
        )
    return good, skipped, total


def _tokenizer(job, files, total_bytes):
    """(the tokenizer trained or loaded, its shortfall note or None, its special ids).

    Nothing is written yet: `_save_tokenizer` puts it into the directory once the shards are."""
    shortfall = None
    if job.tokenizer is None:
        bar = Progress("tokenizer", total_bytes, enabled=job.progress)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", VocabularyShortfallWarning)  # recorded as a PrepareWarning
            tok = train_tokenizer(iter_documents(files, bar.update), job.vocab_size, out_path=None)
        bar.close()
        if shortfall := shortfall_note(tok, job.vocab_size):
            warnings.warn(shortfall, PrepareWarning, stacklevel=4)
    elif isinstance(job.tokenizer, (str, os.PathLike)):
        tok = load_tokenizer(job.tokenizer)
    else:
        tok = job.tokenizer
    specials = special_token_ids(tok)
    if specials["pad"] != PAD_ID:
        raise InputError(f"the tokenizer's <pad> id is {specials['pad']}; the record format needs {PAD_ID}")
    return tok, shortfall, specials


def _save_tokenizer(job, tok, written):
    """out_dir/tokenizer.json: a tokenizer.json given is copied byte for byte, any other
    tokenizer (trained, rebuilt from a Hugging Face or keras-hub directory) saved."""
    out_path = os.path.join(job.out_dir, TOKENIZER_FILE)
    source = None
    if isinstance(job.tokenizer, (str, os.PathLike)):
        source = tokenizer_json_of(job.tokenizer)
        if source is not None and storage.absolute(source) == os.path.abspath(out_path):
            return  # the directory's own tokenizer, reused
    written.append(out_path)
    with atomic_path(out_path) as tmp:
        if source is None:
            tok.save(tmp)
        else:
            with locations.open_binary(source) as f, open(tmp, "wb") as copy:
                shutil.copyfileobj(f, copy)


def _shard_counts(job, total_bytes):
    """(train shards, validation shards): as asked, or ~200 MB each."""
    if job.shards is not None:
        return job.shards, max(1, math.ceil(job.shards * job.validation_fraction))
    # Bytes per input byte, measured: ~0.8 (ids + mask), ~3 with labels (-100 is a 10-byte varint).
    estimate = total_bytes * (3.0 if job.labels else 0.8)
    return (max(1, math.ceil(estimate / TARGET_SHARD_BYTES)),
            max(1, math.ceil(estimate * job.validation_fraction / TARGET_SHARD_BYTES)))


def _records(job, tok, files, specials, on_bytes, counts):
    """Yields (serialized record, goes to validation, real tokens) per sequence, in order."""
    # Never chosen for static masking nor drawn as a random replacement.
    special_ids = set(specials.values()) | {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    vocab = vocabulary_size(tok)
    if job.labels == "static":
        from kroberta.masking import static_labels  # JAX, imported only to make static labels
    docs = encoded_documents(tok, files, on_bytes, line_by_line=job.line_by_line, counts=counts)
    arrange = one_per_document if job.line_by_line else pack_documents
    sequences = arrange(docs, job.seq_len, specials["bos"], specials["eos"], PAD_ID)
    start = 0
    for ids, mask in blocks(sequences, BLOCK):
        label_block = None
        indices = np.arange(start, start + len(ids))
        if job.labels == "static":  # each sequence's mask: a function of (seed, its index)
            ids, label_block = static_labels(
                ids, mask, job.seed, indices, mask_rate=job.mask_rate,
                mask_token_id=specials["mask"], special_token_ids=special_ids, vocabulary_size=vocab)
        held_out = in_validation(indices, job.validation_fraction, job.seed)
        yield from zip(encode_examples(ids, mask, label_block), held_out.tolist(), mask.sum(axis=1).tolist())
        start += len(ids)


def _write_splits(job, records, shards, written):
    """Writes the records into train and validation shards; returns their manifest entries.

    The newest record is held back so that both splits can be made non-empty."""
    train = SplitWriter(job.out_dir, "train", shards[0])
    validation = SplitWriter(job.out_dir, "validation", shards[1])
    pending = None
    try:
        for record in records:
            if pending is not None:
                (validation if pending[1] else train).write(pending[0], pending[2])
            pending = record
        if pending is None:
            raise InputError("no text in the inputs: every document is empty")
        to_validation = pending[1]
        if job.validation_fraction > 0 and validation.sequences == 0 and train.sequences > 0:
            to_validation = True
        elif train.sequences == 0:
            to_validation = False
        (validation if to_validation else train).write(pending[0], pending[2])
        infos = train.finish(), validation.finish()
    except BaseException as e:
        train.abort()
        validation.abort()
        if isinstance(e, InputError):  # a bad record, named by file and line
            raise InputError(str(e)) from None
        raise
    written.extend(os.path.join(job.out_dir, name) for info in infos for name in info["files"])
    held_out, total = validation.sequences, train.sequences + validation.sequences
    if job.validation_fraction > 0 and held_out == 0:
        warnings.warn("only one sequence: nothing left for validation", PrepareWarning, stacklevel=4)
    elif 0 < held_out < STEADY_VALIDATION < total:
        # A loss over a few sequences moves with which ones they are: two runs (or a
        # baseline and a run) would differ by chance, not by their models.
        fraction = min(0.5, math.ceil(100 * STEADY_VALIDATION / total) / 100)
        warnings.warn(f"the validation split holds {held_out} of {total} sequences "
                      f"(--validation-fraction {job.validation_fraction}): its loss is noisy; "
                      f"--validation-fraction {fraction} holds about {round(fraction * total)}",
                      PrepareWarning, stacklevel=4)
    return infos


def _tell_counts(job, counts, files):
    """Logs the documents read; warns of text files read as a few huge documents."""
    kind = "line(s)" if job.line_by_line else "document(s)"
    logger.info(f"read {counts.documents} {kind} from {files} file(s)")
    for path, (lines, first) in counts.long_documents.items():
        # A file of one document per line is one document here: its documents get no
        # </s> between them. Splitting at every line instead would cut each paragraph of
        # hard-wrapped prose (man pages, books) into fragments, so the rule stays.
        warnings.warn(f"{path}: one document of {lines} lines from line {first}: documents end at blank lines, "
                      "and none is between these; if each line is a document, separate them with blank lines, "
                      "or pass --line-by-line for one sequence per line", PrepareWarning, stacklevel=4)


def _manifest(job, tok, specials, splits, scanned, shortfall, timing):
    good, skipped, total_bytes = scanned
    inputs = [job.inputs] if isinstance(job.inputs, (str, os.PathLike)) else job.inputs
    return {
        "format": FORMAT,
        "train": splits[0],
        "validation": splits[1],
        "vocabulary_size": vocabulary_size(tok),
        "requested_vocabulary_size": None if job.tokenizer is not None else job.vocab_size,
        "sequence_length": job.seq_len,
        "special_tokens": specials,
        "tokenizer": TOKENIZER_FILE,
        "labels": job.labels,
        "mask_rate": job.mask_rate,
        "seed": job.seed,
        "validation_fraction": job.validation_fraction,
        "line_by_line": job.line_by_line,
        "source": {
            "inputs": [os.fspath(i) for i in inputs],
            "files": [storage.absolute(f.path) for f in good],
            "text_field": job.text_field if any(f.format for f in good) else None,
            "split": job.split if any(f.format == "datasets" for f in good) else None,
            "bytes": total_bytes,
            "skipped_files": skipped,
            "vocabulary_note": shortfall,
        },
        "timing_s": timing,
    }


def _build(job, scanned, written, started):
    """The work after the checks: tokenizer, shards, tokenizer.json, manifest (last)."""
    good, _, total_bytes = scanned
    tok, shortfall, specials = _tokenizer(job, good, total_bytes)
    tok_time = time.perf_counter() - started
    bar = Progress("encode+pack+write", total_bytes, enabled=job.progress)
    previous_flag = tok.encode_special_tokens
    tok.encode_special_tokens = True  # "<s>" in the text is text, not a control token
    counts = ReadCounts()
    try:
        splits = _write_splits(job, _records(job, tok, good, specials, bar.update, counts),
                               _shard_counts(job, total_bytes), written)
    finally:
        tok.encode_special_tokens = previous_flag
    _tell_counts(job, counts, len(good))
    timing = {"tokenizer": round(tok_time, 3), "encode_pack_write": round(bar.close(), 3)}
    _save_tokenizer(job, tok, written)
    manifest = _manifest(job, tok, specials, splits, scanned, shortfall, timing)
    write_manifest(job.out_dir, manifest)
    return manifest


def _first_missing(path):
    """The outermost directory of `path` that does not exist yet (None when `path` exists)."""
    path = os.path.abspath(path)
    missing = None
    while not os.path.exists(path):
        missing, path = path, os.path.dirname(path)
    return missing


def _remove_partial(created, written):
    """After a failure: the directory this prepare created goes whole; in one that existed,
    only the files it wrote."""
    if created is not None:
        shutil.rmtree(created, ignore_errors=True)
        return
    for path in written:
        with contextlib.suppress(OSError):
            os.remove(path)


def prepare(
    inputs,
    out_dir,
    vocab_size=10000,
    seq_len=64,
    validation_fraction=0.01,
    shards=None,
    labels=None,
    mask_rate=0.15,
    tokenizer=None,
    seed=0,
    strict=False,
    progress=True,
    overwrite=False,
    text_field="text",
    split="train",
    line_by_line=False,
):
    """Turn a corpus into a prepared directory of TFRecord shards.

    Args:
        inputs: glob pattern(s), paths or directories. UTF-8 text files (.txt, or
            .txt.gz) are streams of documents separated by blank lines; JSON lines
            (.jsonl/.json[.gz]), CSV/TSV (.csv/.tsv[.gz], with a header row),
            Parquet (.parquet) and `datasets` directories (`save_to_disk`) hold one
            document per record.
        out_dir: output directory (created; removed again when prepare fails).
        vocab_size: requested vocabulary size when training a tokenizer.
        seq_len: tokens per sequence.
        validation_fraction: share of whole sequences held out, drawn by `seed`.
        shards: train shard count (None: ~200 MB per shard, at least 1).
        labels: "static" to write masked inputs with labels, None for none.
        mask_rate: fraction of each sequence's tokens labelled (static labels).
        tokenizer: a tokenizer to reuse instead of training one: a tokenizer.json,
            a Hugging Face model directory (tokenizer.json, or vocab.json +
            merges.txt), a keras-hub preset directory, or a `tokenizers.Tokenizer`.
        seed: fixes the validation split and static masks.
        strict: fail on binary or non-UTF-8 files instead of skipping them.
        progress: draw progress bars on stderr.
        overwrite: replace an existing prepared directory.
        text_field: the records' column holding the text (record formats only).
        split: the split of a `datasets` DatasetDict to read.
        line_by_line: one sequence per non-empty line of a text file (per record
            of a record file), cut to `seq_len` and padded, instead of packing
            documents into full sequences (Hugging Face run_mlm.py's --line_by_line).

    Returns:
        The manifest dict (also written to out_dir/manifest.json). Raises
        `InputError` with a one-line message when the inputs cannot be used.
    """
    arguments = {k: v for k, v in locals().items() if k != "overwrite"}
    if storage.is_url(out_dir):
        return _prepare_to_url(overwrite, arguments)
    started = time.perf_counter()
    _check_arguments(vocab_size, seq_len, validation_fraction, labels, mask_rate, shards, tokenizer)
    # prepare's arguments, checked, as the steps below read them
    job = types.SimpleNamespace(**{**arguments, "out_dir": os.fspath(out_dir), "line_by_line": bool(line_by_line)})
    _refuse_existing(job.out_dir, overwrite)
    scanned = _scan_inputs(expand_inputs(inputs), strict, text_field, split)
    _clear_previous(job.out_dir)
    created = _first_missing(job.out_dir)
    os.makedirs(job.out_dir, exist_ok=True)
    written = []  # files this prepare put into out_dir under their final names
    try:
        return _build(job, scanned, written, started)
    except BaseException:
        _remove_partial(created, written)
        raise


def _prepare_to_url(overwrite: bool, arguments: dict) -> dict:
    """`prepare` into a URL: built locally, then uploaded, the manifest last (an upload
    cut short leaves no manifest, so no dataset that looks complete)."""
    url = arguments["out_dir"]
    manifest_url = storage.join(url, MANIFEST_NAME)
    try:
        _refuse_existing(url, overwrite)
        with tempfile.TemporaryDirectory(prefix="kroberta-prepare-") as local:
            manifest = prepare(**{**arguments, "out_dir": local})
            if storage.exists(manifest_url):  # --overwrite: the old manifest goes first
                storage.remove(manifest_url)
            storage.put_tree(local, url, last=MANIFEST_NAME)
    except StorageError as error:
        raise InputError(f"--out: {error}") from None
    return manifest
