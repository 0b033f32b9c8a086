"""Building a prepared directory: raw text -> tokenizer -> packed TFRecord shards + manifest.json.

`prepare()` is `python -m kroberta.prepare` as a function (and what a run without
data builds from the embedded corpus; steps: `kroberta.cli.prepare`). The corpus is
cut into chunks (`kroberta.text.chunks`) that worker processes tokenize, pack and
write as parts (`kroberta.text.workers`) in `out_dir/.prepare/`, with the plan and
the tokenizer; the parts are then joined into the shards (`kroberta.text.assembly`)
and the manifest is written last: a directory with a manifest is complete. A prepare
stopped midway (an interrupt, kill -9, a crash) keeps `.prepare/`: run again with the
same arguments, it keeps the finished chunks and ends with the same files as a run
never stopped. An `out_dir` on a URL (gs://, any fsspec filesystem: `kroberta.storage`)
is prepared in a local temporary directory, then uploaded with the manifest last.
"""

import collections
import contextlib
import logging
import math
import numbers
import os
import shutil
import tempfile
import time
import warnings

from tokenizers import Tokenizer

from kroberta import storage
from kroberta.atomic import atomic_path
from kroberta.console import Progress
from kroberta.data.manifest import FORMAT, load_manifest, write_manifest
from kroberta.errors import InputError, StorageError
from kroberta.run_layout import MANIFEST_NAME
from kroberta.text import locations
from kroberta.text.assembly import assemble_splits
from kroberta.text.chunks import CHUNK_BYTES, plan_chunks
from kroberta.text.job import PrepareJob, WorkerJob
from kroberta.text.pool import default_workers, run_chunks
from kroberta.text.recordfiles import check_source
from kroberta.text.resume import Plan, resume_key
from kroberta.text.sample import DEFAULT_SAMPLE_BYTES, sample_documents
from kroberta.text.textfiles import Source, expand_inputs, scan_file
from kroberta.text.tokenizer import (
    MIN_VOCABULARY_SIZE,
    TOKENIZER_FILE,
    VocabularyShortfallWarning,
    load_tokenizer,
    save_tokenizer,
    shortfall_note,
    special_token_ids,
    tokenizer_json_of,
    train_tokenizer,
    vocabulary_size,
)
from kroberta.text.work_dir import WorkDir
from kroberta.tokens import PAD_ID

logger = logging.getLogger(__name__)

MIN_SEQ_LEN = 8
TARGET_SHARD_BYTES = 200e6  # shards of ~100-200 MB: few files, yet parallel reads
STEADY_VALIDATION = 100  # validation sequences below which prepare warns
MIN_CHUNK_BYTES = 1 << 20  # below this, a chunk's start-up and padded last sequence start to count


class PrepareWarning(UserWarning):
    """Something was skipped or adjusted; recorded in the manifest too."""


def _check_arguments(
    vocab_size, seq_len, validation_fraction, labels, mask_rate, shards, tokenizer
):
    # Python callers can pass anything: the types first, each named by its option.
    for option, value, kind in (
        ("--vocab-size", vocab_size, numbers.Integral),
        ("--seq-len", seq_len, numbers.Integral),
        ("--validation-fraction", validation_fraction, numbers.Real),
        ("--mask-rate", mask_rate, numbers.Real),
        ("--shards", shards if shards is not None else 1, numbers.Integral),
    ):
        if not isinstance(value, kind) or isinstance(value, bool):
            wanted = "an integer" if kind is numbers.Integral else "a number"
            raise InputError(
                f"{option} (prepare's {option[2:].replace('-', '_')}) must be "
                f"{wanted}, got {value!r}"
            )
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
        raise InputError(
            f"--out {out_dir}: exists and is a file; give a directory to write "
            "the prepared dataset into"
        )
    path = storage.join(out_dir, MANIFEST_NAME)
    if storage.exists(path) and not overwrite:
        raise InputError(
            f"{out_dir} already holds a prepared dataset ({path}); pass "
            "--overwrite (overwrite=True) to replace it"
        )


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
    good, skipped, sizes, has_text = [], [], [], False
    for path in files:
        source = Source.of(path, text_field, split)
        if source.format is not None:
            try:
                size = check_source(source.path, source.format, text_field, split)
            except OSError as e:
                raise InputError(f"{path}: unreadable ({e.strerror or e})") from None
            # Empty records are known only once read (an all-empty corpus is refused then);
            # an empty file now, before a tokenizer is trained on nothing.
            problem, text = None, size > 0
        else:
            try:
                size, problem, offset, text = scan_file(path)
            except OSError as e:
                size, problem, offset, text = 0, f"unreadable ({e.strerror or e})", None, False
        if problem is None:
            good.append(source)
            sizes.append(size)
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
    return good, skipped, sizes


def _tokenizer(job, chunks, total_bytes, taken):
    """(the tokenizer trained on the sample or loaded, its shortfall note or None, its
    special ids). Nothing is written into out_dir yet: `_save_tokenizer` puts it there
    once the shards are."""
    shortfall = None
    if job.tokenizer is None:
        bar = Progress(
            min(total_bytes, job.tokenizer_sample_bytes), "tokenizer", enabled=job.progress
        )
        with warnings.catch_warnings():  # a shortfall is recorded as a PrepareWarning
            warnings.simplefilter("ignore", VocabularyShortfallWarning)
            documents = sample_documents(
                chunks, total_bytes, job.tokenizer_sample_bytes, bar.add, taken
            )
            tok = train_tokenizer(documents, job.vocab_size, out_path=None)
        bar.close()
        if shortfall := shortfall_note(tok, job.vocab_size):
            warnings.warn(shortfall, PrepareWarning, stacklevel=5)
    else:
        tok = job.given_tokenizer
    specials = special_token_ids(tok)
    if specials["pad"] != PAD_ID:
        raise InputError(
            f"the tokenizer's <pad> id is {specials['pad']}; the record format needs {PAD_ID}"
        )
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
    with WorkDir.of(job.out_dir).writing(out_path, "tokenizer"):
        if source is None:
            save_tokenizer(tok, out_path)
            return
        with (
            atomic_path(out_path) as tmp,
            locations.open_input(source) as f,
            open(tmp, "wb") as copy,
        ):
            shutil.copyfileobj(f, copy)


def _shard_counts(job, total_bytes):
    """(train shards, validation shards): as asked, or ~200 MB each."""
    if job.shards is not None:
        return job.shards, max(1, math.ceil(job.shards * job.validation_fraction))
    # Bytes per input byte, measured: ~0.8 (ids + mask), ~3 with labels (-100 is a 10-byte varint).
    estimate = total_bytes * (3.0 if job.labels else 0.8)
    return (
        max(1, math.ceil(estimate / TARGET_SHARD_BYTES)),
        max(1, math.ceil(estimate * job.validation_fraction / TARGET_SHARD_BYTES)),
    )


def _chunk_bytes(job, total_bytes):
    """Input bytes per chunk: as asked, else about 1/64 of the corpus (work for every
    core), 1-64 MB, and small enough for the train shards asked (one part per shard at
    least). A function of the corpus and arguments only: the same chunks for any
    number of workers."""
    if job.chunk_bytes is not None:
        return job.chunk_bytes
    size = min(CHUNK_BYTES, max(MIN_CHUNK_BYTES, total_bytes // 64))
    return max(1, min(size, math.ceil(total_bytes / _shard_counts(job, total_bytes)[0])))


def _tell(job, results, chunks):
    """Logs the documents read; warns of text files read as a few huge documents."""
    documents = sum(r.documents for r in results.values())
    files = len({s.path for c in chunks for s in c.sources})
    logger.info(
        f"read {documents} {'line(s)' if job.line_by_line else 'document(s)'} from {files} file(s)"
    )
    lines_before, longest = collections.Counter(), {}
    for chunk in chunks:  # line numbers count from a piece's start: made the file's
        result = results[chunk.index]
        for path, (lines, first) in result.long_documents.items():
            if lines > longest.get(path, (0,))[0]:
                longest[path] = (lines, lines_before[path] + first)
        lines_before.update(result.lines)
    for path, (lines, first) in longest.items():
        # A file of one document per line is one document here: its documents get no
        # </s> between them. Splitting at every line instead would cut each paragraph of
        # hard-wrapped prose (man pages, books) into fragments, so the rule stays.
        warnings.warn(
            f"{path}: one document of {lines} lines from line {first}: documents end at blank lines, "
            "and none is between these; if each line is a document, separate them with blank lines, "
            "or pass --line-by-line for one sequence per line",
            PrepareWarning,
            stacklevel=5,
        )


def _warn_of_validation(job, splits):
    held_out = splits[1]["sequences"]
    total = splits[0]["sequences"] + held_out
    if job.validation_fraction > 0 and held_out == 0:
        warnings.warn(
            "only one sequence: nothing left for validation", PrepareWarning, stacklevel=5
        )
    elif 0 < held_out < STEADY_VALIDATION < total:
        # A loss over a few sequences moves with which ones they are: two runs (or a
        # baseline and a run) would differ by chance, not by their models.
        fraction = min(0.5, math.ceil(100 * STEADY_VALIDATION / total) / 100)
        warnings.warn(
            f"the validation split holds {held_out} of {total} sequences "
            f"(--validation-fraction {job.validation_fraction}): its loss is noisy; "
            f"--validation-fraction {fraction} holds about {round(fraction * total)}",
            PrepareWarning,
            stacklevel=5,
        )


def _manifest(job, tok, specials, splits, plan, documents, timing):
    inputs = [job.inputs] if isinstance(job.inputs, (str, os.PathLike)) else job.inputs
    formats = [f[1] for f in plan.files]
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
            "files": [storage.absolute(f[0]) for f in plan.files],
            "text_field": job.text_field if any(formats) else None,
            "split": job.split if "datasets" in formats else None,
            "bytes": plan.total_bytes,
            "documents": documents,
            "chunks": len(plan.chunks),
            "skipped_files": plan.skipped,
            "vocabulary_note": plan.shortfall,
            "tokenizer_sample_bytes": plan.tokenizer_sample_bytes,
        },
        "timing_s": timing,
    }


def _plan(job, scanned, key, work, started):
    """Cuts the scanned inputs into chunks, trains the tokenizer (or takes the one
    given) and saves it and the plan into `work`; returns the plan."""
    good, skipped, sizes = scanned
    total = sum(sizes)
    chunks = plan_chunks(good, sizes, _chunk_bytes(job, total))
    taken = [0]
    tok, shortfall, specials = _tokenizer(job, chunks, total, taken)
    with storage.writing(work.tokenizer_path, "tokenizer"):
        save_tokenizer(tok, work.tokenizer_path)
    plan = Plan(
        key=key,
        chunks=chunks,
        skipped=skipped,
        total_bytes=total,
        files=[[g.path, g.format] for g in good],
        shortfall=shortfall,
        specials=specials,
        tokenizer_sample_bytes=None if job.tokenizer is not None else taken[0],
        tokenizer_s=round(time.perf_counter() - started, 3),
    )
    work.save_plan(plan)
    return plan


def _worker_job(job, tok, specials, work):
    """What every worker needs, picklable."""
    special_ids = set(specials.values()) | {
        i for i, t in tok.get_added_tokens_decoder().items() if t.special
    }
    return WorkerJob(
        tokenizer_json=tok.to_str(),
        seq_len=job.seq_len,
        line_by_line=job.line_by_line,
        labels=job.labels,
        mask_rate=job.mask_rate,
        seed=job.seed,
        specials=specials,
        special_ids=sorted(special_ids),
        vocabulary_size=vocabulary_size(tok),
        validation_fraction=job.validation_fraction,
        work_dir=work,
    )


def _build(job, work, key, plan, scanned, written, started):
    """The work after the checks: the plan (unless a stopped run's is taken up), the
    chunks, the shards, tokenizer.json, the manifest (last); the work directory goes
    once the manifest is there."""
    if plan is None:  # nothing, or a run stopped before its plan was saved
        work.create()
        plan = _plan(job, scanned, key, work, started)
    chunks = plan.chunks
    tok = Tokenizer.from_file(work.tokenizer_path)
    work.remove_stray()
    results = work.finished(chunks)
    if results:
        logger.info(f"resuming {job.out_dir}: {len(results)} of {len(chunks)} chunks done before")
    bar = Progress(plan.total_bytes, "encode+pack+write", enabled=job.progress)
    bar.add(sum(c.size for c in chunks if c.index in results))
    pending = [c for c in chunks if c.index not in results]
    try:
        results.update(
            run_chunks(_worker_job(job, tok, plan.specials, work), pending, job.workers, bar)
        )
    except BaseException:
        bar.erase()  # the command's one line takes its place
        raise
    timing = {"tokenizer": plan.tokenizer_s, "encode_pack_write": round(bar.close(), 3)}
    if not any(r.train.sequences + r.validation.sequences for r in results.values()):
        raise InputError("no text in the inputs: every document is empty")
    _tell(job, results, chunks)
    joining = time.perf_counter()
    splits = assemble_splits(
        job.out_dir,
        work,
        results,
        _shard_counts(job, plan.total_bytes),
        job.validation_fraction,
        written,
    )
    _warn_of_validation(job, splits)
    _save_tokenizer(job, tok, written)
    timing["assemble"] = round(time.perf_counter() - joining, 3)
    documents = sum(r.documents for r in results.values())
    manifest = _manifest(job, tok, plan.specials, splits, plan, documents, timing)
    with work.writing(os.path.join(job.out_dir, MANIFEST_NAME), "manifest"):
        write_manifest(job.out_dir, manifest)
    work.remove()
    return manifest


def _first_missing(path):
    """The outermost directory of `path` that does not exist yet (None when `path` exists)."""
    path = os.path.abspath(path)
    missing = None
    while not os.path.exists(path):
        missing, path = path, os.path.dirname(path)
    return missing


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
    workers=None,
    tokenizer_sample_bytes=DEFAULT_SAMPLE_BYTES,
    chunk_bytes=None,
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
        workers: processes that tokenize, pack and write (None: one per CPU core;
            1: this process alone). The output is the same for any number.
        tokenizer_sample_bytes: train the tokenizer on a deterministic sample of
            about this many bytes, taken from every part of the corpus (the whole
            corpus when it is smaller).
        chunk_bytes: input bytes per chunk, the unit of work and of resuming (None:
            about 1/64 of the corpus, 1-64 MB). Part of what decides the output.

    Returns:
        The manifest dict (also written to out_dir/manifest.json). Raises
        `InputError` with a one-line message when the inputs cannot be used.
    """
    arguments = {k: v for k, v in locals().items() if k != "overwrite"}
    if storage.is_url(out_dir):
        return _prepare_to_url(overwrite, arguments)
    started = time.perf_counter()
    _check_arguments(vocab_size, seq_len, validation_fraction, labels, mask_rate, shards, tokenizer)
    _check_scale(workers, tokenizer_sample_bytes, chunk_bytes)
    return _prepare_into(arguments, workers or default_workers(), overwrite, started)


def _prepare_into(arguments, workers, overwrite, started):
    """`prepare` into a local directory, after the arguments' checks."""
    _refuse_existing(os.fspath(arguments["out_dir"]), overwrite)
    # A tokenizer named by its path is read now: a wrong path fails before any reading.
    tokenizer = arguments["tokenizer"]
    given = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer
    job = PrepareJob.of(arguments, workers, given)
    files = expand_inputs(job.inputs)
    work, key = WorkDir.of(job.out_dir), resume_key(job, files)
    plan = None if overwrite else work.load_plan()
    if plan is not None and plan.key != key:
        raise InputError(
            f"{job.out_dir} holds an unfinished prepare of other inputs or arguments ({work}); "
            "run that command again to finish it, or pass --overwrite to start over"
        )
    scanned = (
        None if plan is not None else _scan_inputs(files, job.strict, job.text_field, job.split)
    )
    _clear_previous(job.out_dir)
    if overwrite:
        work.remove()
    created = _first_missing(job.out_dir)
    with storage.writing(job.out_dir, "output directory"):
        os.makedirs(job.out_dir, exist_ok=True)
    written = []  # files this prepare put into out_dir under their final names
    try:
        return _build(job, work, key, plan, scanned, written, started)
    except BaseException as error:
        for path in written:
            with contextlib.suppress(OSError):
                os.remove(path)
        if not isinstance(error, InputError) and work.has_plan():
            # The finished chunks stay, for the next run; what stopped workers were
            # writing goes: the space comes back now.
            work.remove_stray()
        else:  # the work too, and the output directory when this prepare created it
            work.remove()
            if created is not None:
                shutil.rmtree(created, ignore_errors=True)
        raise


def _check_scale(workers, tokenizer_sample_bytes, chunk_bytes):
    for option, value in (
        ("--workers", workers),
        ("--tokenizer-sample-bytes", tokenizer_sample_bytes),
        ("chunk_bytes", chunk_bytes),
    ):
        if value is None and option != "--tokenizer-sample-bytes":
            continue
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
            raise InputError(f"{option} must be a positive integer, got {value!r}")


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
