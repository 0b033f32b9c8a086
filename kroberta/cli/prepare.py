"""Raw text -> tokenizer -> packed TFRecord shards + manifest.json.

    python -m kroberta.prepare --input 'corpus/*.txt' --out data/mycorpus --vocab-size 10000 --seq-len 64
    python -m kroberta.prepare --input 'corpus/*.jsonl.gz' --text-field body --out data/mycorpus
    python -m kroberta.prepare --input 'corpus/*.txt' --tokenizer roberta-model/ --out data/domain
    python -m kroberta.prepare --check data/mycorpus

Inputs: text (.txt, .txt.gz: documents end at blank lines), JSON lines (.jsonl,
.json, gzipped or not), CSV/TSV, Parquet and `datasets` directories (save_to_disk;
a DatasetDict's --split): one document per record, its --text-field column.

Steps: scan the inputs (skip binary / non-UTF-8 text files), cut them into chunks,
train a byte-level BPE tokenizer on a sample of them (or reuse --tokenizer), then in
--workers processes tokenize, pack and write each chunk (train/validation chosen per
sequence by a seeded hash, optional static labels), join the chunks into the shards
and write the manifest last: a directory with a manifest is complete. A stopped run
keeps its finished chunks in OUT/.prepare: the same command resumes it.
"""

import argparse
import os
import sys
import warnings

from kroberta import cli, storage
from kroberta.data.manifest import load_manifest
from kroberta.errors import InputError
from kroberta.run_layout import MANIFEST_NAME
from kroberta.text.build import PrepareWarning, prepare
from kroberta.text.sample import DEFAULT_SAMPLE_BYTES
from kroberta.text.textfiles import expand_inputs


def _summary(manifest, out_dir):
    src, tr, va = manifest["source"], manifest["train"], manifest["validation"]
    lines = [
        f"prepared {out_dir}: {tr['sequences']} train sequences ({tr['tokens']} tokens) in {len(tr['files'])} "
        f"file(s), {va['sequences']} validation sequences ({va['tokens']} tokens) in {len(va['files'])} file(s)",
        f"  vocabulary_size={manifest['vocabulary_size']} sequence_length={manifest['sequence_length']} "
        f"labels={manifest['labels']} from {len(src['files'])} file(s), {src['bytes'] / 1e6:.1f} MB",
    ]
    if src["skipped_files"]:
        lines.append(
            f"  skipped {len(src['skipped_files'])} file(s) (binary or not UTF-8): see manifest source.skipped_files"
        )
    return "\n".join(lines)


def _parser():
    p = cli.ArgumentParser(
        prog="python -m kroberta.prepare",
        inputs="--input",
        description="\n\n".join(__doc__.split("\n\n")[:2]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--input",
        action="append",
        help="files, globs or directories: .txt[.gz], .jsonl/.json[.gz], .csv/.tsv[.gz], .parquet, "
        "datasets save_to_disk directories (repeatable; quote globs)",
    )
    p.add_argument("--text-field", default="text", help="the records' text column (default: text)")
    p.add_argument(
        "--split", default="train", help="the split of a datasets DatasetDict (default: train)"
    )
    p.add_argument("--out", help="output directory")
    p.add_argument("--vocab-size", type=int, help="tokenizer vocabulary size (default 10000)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default 64)")
    p.add_argument(
        "--validation-fraction",
        type=float,
        default=0.01,
        help="share of the packed sequences held out for validation (default 0.01)",
    )
    p.add_argument("--shards", type=int, help="train shards (default: ~200 MB each)")
    p.add_argument("--labels", choices=["static"], help="write static masked-LM labels")
    p.add_argument(
        "--mask-rate",
        type=float,
        default=0.15,
        help="with --labels static: share of the tokens masked once (default 0.15)",
    )
    p.add_argument(
        "--tokenizer",
        help="reuse a tokenizer instead of training one: a tokenizer.json, a Hugging Face model "
        "directory (tokenizer.json, or vocab.json + merges.txt) or a keras-hub preset directory",
    )
    p.add_argument(
        "--line-by-line",
        action="store_true",
        help="one sequence per non-empty line (per record of JSON/CSV/Parquet inputs), cut to "
        "--seq-len and padded, instead of packing documents into full sequences",
    )
    p.add_argument(
        "--workers",
        type=int,
        help="processes that tokenize, pack and write (default: one per CPU core); the output is "
        "the same for any number",
    )
    p.add_argument(
        "--tokenizer-sample-bytes",
        type=_size,
        default=DEFAULT_SAMPLE_BYTES,
        metavar="BYTES",
        help="train the tokenizer on a sample of about this much text from every part of the corpus "
        "(e.g. 500M, 2G; default 1G; the whole corpus when smaller)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the validation split, the shard order and static masks (default 0)",
    )
    p.add_argument("--strict", action="store_true", help="fail on binary / non-UTF-8 files")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing prepared directory, or start a stopped prepare over instead of "
        "resuming it",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    _add_check_arguments(p)
    return p


def _add_check_arguments(p):
    p.add_argument(
        "--check",
        metavar="PATH",
        help="validate TFRecords: a prepared dir, any dir of .tfrecord files (with --vocab-size), "
        "a file or a glob",
    )
    p.add_argument(
        "--max-records", type=int, help="with --check: only the first N records per file"
    )


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _size(text):
    """A byte count: 1000, 500M, 2G (binary units)."""
    number = text.rstrip("KMGTkmgtBb")
    unit = text[len(number) :].upper().rstrip("B")
    try:
        value = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size (e.g. 1000000, 500M, 2G)"
        ) from None
    return int(value)


TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfr")


def _tfrecords_in(directory):
    """Every TFRecord file under `directory` (by name: *.tfrecord[s], *.tfr, *.tfrecord-00000-of-00004)."""
    every = storage.files_under(directory)
    names = [os.path.basename(path).lower() for path in every]
    found = [
        path
        for path, name in zip(every, names)
        if name.endswith(TFRECORD_SUFFIXES) or ".tfrecord-" in name or ".tfrecords-" in name
    ]
    if not found:
        raise InputError(
            f"--check {directory}: no {MANIFEST_NAME} and no TFRecord files "
            f"({', '.join('*' + x for x in TFRECORD_SUFFIXES)}, *.tfrecord-*) in it; name the "
            "files with a glob"
        )
    return found


def _run_check(args):
    # start-up: NumPy and TensorFlow load only for --check
    from kroberta.data.check import check_records

    vocab, length = args.vocab_size, args.seq_len
    # A URL (gs://...): listed through kroberta.storage; its records are read by tf.data.
    manifest = storage.join(args.check, MANIFEST_NAME)
    if storage.isdir(args.check) and not storage.isfile(manifest):
        paths = _tfrecords_in(args.check)
        if vocab is None:
            raise InputError(
                f"--check {args.check}: a directory without {MANIFEST_NAME} needs "
                "--vocab-size (the tokenizer's vocabulary size) to check the ids against"
            )
    elif storage.isdir(args.check):
        m = load_manifest(args.check)
        paths = list(m.files)
        vocab = vocab if vocab is not None else m.vocabulary_size
        length = length if length is not None else m.sequence_length
    else:
        try:
            paths = expand_inputs(args.check)
        except InputError:  # the files are named as --check's, not --input's
            raise InputError(
                f"--check {args.check}: no files match it; give a prepared directory, a "
                "directory of TFRecord files, a file or a glob"
            ) from None
    report = check_records(
        paths, vocabulary_size=vocab, sequence_length=length, max_records=args.max_records
    )
    print(report.summary())
    return 0 if report.ok else 1


def _run(args) -> int:
    """--check's exit code, or prepare's 0 after its summary."""
    if args.check:
        if args.input or args.out:
            raise InputError(
                "--check takes only PATH (and --vocab-size/--seq-len), not --input/--out"
            )
        return _run_check(args)
    if not args.input or not args.out:
        raise InputError("--input and --out are required (or --check PATH)")
    if args.tokenizer and args.vocab_size is not None:
        warnings.warn(
            "--vocab-size is ignored with --tokenizer: the tokenizer's own vocabulary is used",
            PrepareWarning,
            stacklevel=1,
        )
    manifest = prepare(
        args.input, args.out,
        vocab_size=args.vocab_size or 10000, seq_len=args.seq_len or 64,
        validation_fraction=args.validation_fraction, shards=args.shards, labels=args.labels,
        mask_rate=args.mask_rate, tokenizer=args.tokenizer, seed=args.seed, strict=args.strict,
        progress=not args.no_progress, overwrite=args.overwrite, text_field=args.text_field,
        split=args.split, line_by_line=args.line_by_line, workers=args.workers,
        tokenizer_sample_bytes=args.tokenizer_sample_bytes,
    )  # fmt: skip
    print(_summary(manifest, args.out))
    return 0


def main(argv=None) -> int:
    """CLI entry point; returns the exit code (0 ok, 1 defects found, 2 usage/input error)."""
    args = _parser().parse_args(argv)
    with warnings.catch_warnings():
        # One line per warning on stderr, no source line: these are messages for users.
        warnings.showwarning = lambda message, *a, **k: print(
            f"warning: {message}", file=sys.stderr
        )
        return cli.run(
            lambda: _run(args),
            interrupted=f"interrupted: no manifest written; the finished chunks are kept in "
            f"{args.out}/.prepare: the same command resumes, --overwrite starts over",
        )
