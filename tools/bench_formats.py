"""Benchmark prepare's input readers side by side: speed and memory per format.

    python tools/bench_formats.py [--mb 8] [--scale 4] [--rounds 3]

Writes the same synthetic documents (Zipf words, log-normal lengths) as .txt,
.txt.gz, .jsonl, .jsonl.gz, a JSON array, .csv, .parquet and a `datasets`
directory, then reads each with kroberta's reader (`textfiles.iter_documents`,
what prepare's tokenizer and encoding passes consume), in interleaved rounds in
this one process. Prints MB/s of document text (median over rounds), the ratio
to the .txt reader, and the peak of anonymous resident memory (RssAnon, the heap)
above the reader's start (sampled every 5 ms, in a fresh process per reading) for
the corpus and for one `--scale` times larger: flat memory means the two peaks
stay alike. Checks that every format yields the .txt's documents.
Standalone: never imported by the package.
"""

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_documents(megabytes, seed=0, vocabulary=20000):
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = np.array(
        [
            "".join(rng.choice(letters, int(np.clip(rng.geometric(0.25), 1, 12))))
            for _ in range(vocabulary)
        ],
        dtype=object,
    )
    docs, size = [], 0
    while size < megabytes * 1e6:
        lengths = np.clip(rng.lognormal(5.0, 1.0, 200).astype(int), 3, 3000)
        tokens = words[np.minimum(rng.zipf(1.1, lengths.sum()), vocabulary) - 1]
        start = 0
        for n in lengths:
            doc = " ".join(tokens[start : start + n]) + "."
            start += n
            docs.append(doc)
            size += len(doc) + 2
    return docs


def write_all(directory, docs):
    """Every format of the same documents; returns {name: path}."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(directory, exist_ok=True)
    paths = {
        name: os.path.join(directory, f"corpus.{name}")
        for name in ("txt", "txt.gz", "jsonl", "jsonl.gz", "json", "csv", "parquet")
    }
    text = "\n\n".join(docs) + "\n"
    with open(paths["txt"], "w") as f:
        f.write(text)
    with gzip.open(paths["txt.gz"], "wt", compresslevel=6) as f:
        f.write(text)
    lines = "".join(json.dumps({"text": d}) + "\n" for d in docs)
    with open(paths["jsonl"], "w") as f:
        f.write(lines)
    with gzip.open(paths["jsonl.gz"], "wt", compresslevel=6) as f:
        f.write(lines)
    with open(paths["json"], "w") as f:
        json.dump([{"text": d} for d in docs], f)
    import csv

    with open(paths["csv"], "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text"])
        writer.writerows([d] for d in docs)
    # Row groups of 2048 rows (~2 MB of text here): both corpora hold several.
    pq.write_table(pa.table({"text": docs}), paths["parquet"], row_group_size=2048)
    paths["datasets"] = os.path.join(directory, "corpus.datasets")
    datasets.disable_progress_bars()
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(paths["datasets"])
    return paths


def _rss():
    """Anonymous resident memory (the heap), in bytes: the memory-mapped pages of a
    `datasets` directory are the page cache's, reclaimable, and not counted."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def read(path, check=None):
    """(seconds, characters read, RSS peak above the start in bytes)."""
    from kroberta.text.textfiles import Source, iter_documents

    start_rss, peak, done = _rss(), [0], threading.Event()

    def sample():
        while not done.wait(0.005):
            peak[0] = max(peak[0], _rss() - start_rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started, chars = time.perf_counter(), 0
    for i, doc in enumerate(iter_documents([Source.of(path)])):
        chars += len(doc)
        if check is not None and doc != check[i]:
            raise SystemExit(f"{path}: document {i} differs from the .txt's")
    elapsed = time.perf_counter() - started
    done.set()
    sampler.join()
    return elapsed, chars, max(peak[0], _rss() - start_rss)


def _peak_in_child(path):
    """The reader's heap peak in a fresh process: in this one, memory freed by earlier
    reads is reused and would hide a reader's growth."""
    import subprocess

    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--measure", path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.split()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--measure", metavar="PATH", help=argparse.SUPPRESS
    )  # the child of _peak_in_child
    parser.add_argument("--mb", type=float, default=8.0, help="MB of document text in the corpus")
    parser.add_argument(
        "--scale", type=int, default=4, help="the larger corpus is this many times the corpus"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", help="where to write the files (default: a temporary directory)")
    args = parser.parse_args(argv)
    import kroberta  # noqa: F401  (the quiet start, before pyarrow/datasets pull in anything)

    if args.measure:
        import datasets  # noqa: F401  (imported before the baseline: the reader's growth only)
        import pyarrow.parquet  # noqa: F401

        print(read(args.measure)[2])
        return

    root = args.dir or tempfile.mkdtemp(prefix="bench_formats_")
    try:
        run(args, root)
    finally:
        if not args.dir:
            import shutil

            shutil.rmtree(root, ignore_errors=True)


def run(args, root):
    docs = make_documents(args.mb)
    small = write_all(os.path.join(root, "small"), docs)
    large = write_all(os.path.join(root, "large"), docs * args.scale)
    from kroberta.text.textfiles import record_document

    expected = [record_document(d) for d in docs]
    times = {name: [] for name in small}
    for path in small.values():  # correctness once, outside the timed rounds
        read(path, expected)
    for _ in range(args.rounds):
        for name, path in small.items():
            seconds, chars, _ = read(path)
            times[name].append(chars / 1e6 / seconds)
    peaks = {name: (_peak_in_child(small[name]), _peak_in_child(large[name])) for name in small}
    base = statistics.median(times["txt"])
    print(
        f"{len(docs)} documents, {sum(map(len, docs)) / 1e6:.1f} MB of text; larger corpus x{args.scale}"
    )
    print(
        "| format | file MB | MB/s of text (median) | x .txt | heap peak MiB | heap peak MiB, x"
        f"{args.scale} corpus |"
    )
    print("|---|---|---|---|---|---|")
    for name, path in small.items():
        size = (
            sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
            if os.path.isdir(path)
            else os.path.getsize(path)
        )
        rate = statistics.median(times[name])
        print(
            f"| {name} | {size / 1e6:.1f} | {rate:.1f} | {rate / base:.2f} | {peaks[name][0] / 2**20:.1f} | "
            f"{peaks[name][1] / 2**20:.1f} |"
        )


if __name__ == "__main__":
    main()
