"""The serial pass that finds where prepare cuts a large record file, against reading it.

prepare's main process finds each large file's cut points before the workers start:
a text, JSON lines or TSV file by seeking to each target offset (a few reads per
chunk), a CSV by reading it once with the csv parser (a quoted field may span lines).
This prints, for the same documents in each format, the CPU-seconds per MB of that
pass and of reading the file's documents (`iter_documents`, what a worker does before
tokenizing), and their ratio. One worker's whole CPU time per MB is in
docs/benchmarks/prepare.md.

    python tools/bench_prepare_cuts.py --mb 150
"""

import argparse
import csv
import json
import os
import random
import tempfile
import time

from kroberta.text.chunks import file_cut_points
from kroberta.text.textfiles import Source, iter_documents

WORDS = 'the cat sat on a mat, while "dogs" ran far away über café 日本'.split()


def documents(count, seed=0):
    """Documents of 1-3 lines holding commas and quotes (a CSV quotes most of them)."""
    rng = random.Random(seed)
    return [
        "\n".join(
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60)))
            for _ in range(rng.randint(1, 3))
        )
        for _ in range(count)
    ]


def write_files(directory, megabytes):
    """The same documents as a .txt, a .jsonl, a .tsv (line breaks as spaces) and a .csv."""
    docs = documents(20_000)
    repeats = max(1, round(megabytes * 1e6 / sum(len(d.encode()) + 2 for d in docs)))
    paths = {
        name: os.path.join(directory, f"corpus.{name}") for name in ("txt", "jsonl", "tsv", "csv")
    }
    with open(paths["txt"], "w", encoding="utf-8") as f:
        for _ in range(repeats):
            f.writelines(d + "\n\n" for d in docs)
    with open(paths["jsonl"], "w", encoding="utf-8") as f:
        for _ in range(repeats):
            f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    with open(paths["tsv"], "w", encoding="utf-8") as f:
        f.write("text\n")
        for _ in range(repeats):
            f.writelines(d.replace("\n", " ") + "\n" for d in docs)
    with open(paths["csv"], "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text"])
        for _ in range(repeats):
            writer.writerows([d] for d in docs)
    return paths


def cpu_seconds(function):
    start = time.process_time()
    result = function()
    return time.process_time() - start, result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--mb", type=float, default=150.0, help="size of each file in MB (default 150)"
    )
    parser.add_argument("--chunk-mb", type=float, default=1.0, help="chunk size in MB (default 1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        paths = write_files(directory, args.mb)
        print(
            f"{'format':<7} {'MB':>7} {'cuts':>6} {'cut CPU s/MB':>13} {'read CPU s/MB':>14} {'cut / read':>11}"
        )
        for name, path in paths.items():
            size, source = os.path.getsize(path), Source.of(path)
            cut_s, cuts = cpu_seconds(
                lambda source=source, size=size: file_cut_points(
                    source, size, int(args.chunk_mb * 1e6)
                )
            )
            read_s, _ = cpu_seconds(lambda source=source: sum(1 for _ in iter_documents([source])))
            megabytes = size / 1e6
            print(
                f"{name:<7} {megabytes:7.1f} {len(cuts):6d} {cut_s / megabytes:13.4f} "
                f"{read_s / megabytes:14.4f} {cut_s / read_s:11.3f}"
            )


if __name__ == "__main__":
    main()
