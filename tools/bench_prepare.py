"""Benchmark `python -m kroberta.prepare` on a synthetic corpus.

    python tools/bench_prepare.py --mb 50 [--vocab-size 10000] [--seq-len 64] [--labels static] [--keep DIR]

Generates words from a Zipf distribution over a generated vocabulary, documents of
log-normally varied length (blank-line separated, several files), runs `prepare`
and prints MB, seconds, MB/s and tokens/s for tokenizer training, encoding +
packing + writing, and the total. Standalone: never imported by the package.
"""

import argparse
import os
import shutil
import string
import sys
import tempfile
import time

import numpy as np


def make_vocabulary(rng, size):
    """`size` distinct lowercase pseudo-words, 1-12 letters (shorter ones more common)."""
    letters = np.array(list(string.ascii_lowercase))
    words, seen = [], set()
    while len(words) < size:
        length = int(np.clip(rng.geometric(0.25), 1, 12))
        word = "".join(rng.choice(letters, length))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return np.array(words, dtype=object)


def write_corpus(directory, megabytes, seed=0, files=8, vocabulary=50000):
    """Write ~`megabytes` MB of Zipf text into `files` files; returns their paths."""
    rng = np.random.default_rng(seed)
    words = make_vocabulary(rng, vocabulary)
    target = int(megabytes * 1e6 / files)
    paths = []
    for i in range(files):
        path = os.path.join(directory, f"part-{i:03d}.txt")
        written = 0
        with open(path, "w", encoding="utf-8") as f:
            while written < target:
                # 200 documents at a time: lengths ~ lognormal (median ~150 words).
                lengths = np.clip(rng.lognormal(5.0, 1.0, 200).astype(int), 3, 5000)
                ranks = np.minimum(rng.zipf(1.1, lengths.sum()), vocabulary) - 1
                tokens = words[ranks]
                docs, start = [], 0
                for n in lengths:
                    sentence = " ".join(tokens[start : start + n])
                    docs.append(sentence[:1].upper() + sentence[1:] + ".")
                    start += n
                chunk = "\n\n".join(docs) + "\n\n"
                f.write(chunk)
                written += len(chunk)
        paths.append(path)
    return paths


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=50.0, help="corpus size in MB (default 50)")
    parser.add_argument("--vocab-size", type=int, default=10000)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--labels", choices=["static"], default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", help="keep the corpus and output in this directory")
    args = parser.parse_args()

    # Run from a checkout without installing: the repository root holds kroberta/.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from kroberta.text.build import prepare  # after argparse: --help stays fast

    root = args.keep or tempfile.mkdtemp(prefix="bench_prepare_")
    os.makedirs(os.path.join(root, "corpus"), exist_ok=True)
    try:
        t0 = time.perf_counter()
        paths = write_corpus(os.path.join(root, "corpus"), args.mb, args.seed)
        mb = sum(os.path.getsize(p) for p in paths) / 1e6
        print(f"generated {mb:.1f} MB in {len(paths)} files in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        t0 = time.perf_counter()
        m = prepare(
            paths, os.path.join(root, "out"), vocab_size=args.vocab_size, seq_len=args.seq_len,
            labels=args.labels, seed=args.seed, progress=True, overwrite=True,
        )  # fmt: skip
        total = time.perf_counter() - t0
        tokens = m["train"]["tokens"] + m["validation"]["tokens"]
        t_tok, t_enc = m["timing_s"]["tokenizer"], m["timing_s"]["encode_pack_write"]
        print(f"\nvocab {m['vocabulary_size']}, seq_len {args.seq_len}, labels {args.labels}, "
              f"{tokens} tokens, {m['train']['sequences'] + m['validation']['sequences']} sequences, {os.cpu_count()} CPUs")
        print(f"{'phase':<22}{'MB':>8}{'seconds':>10}{'MB/s':>8}{'tokens/s':>12}")
        for name, seconds in (("tokenizer training", t_tok), ("encode+pack+write", t_enc), ("total", total)):
            print(f"{name:<22}{mb:>8.1f}{seconds:>10.1f}{mb / seconds:>8.2f}{tokens / seconds:>12,.0f}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
