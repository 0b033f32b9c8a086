"""Benchmark `prepare` side by side with `tokenizers` alone and Hugging Face's run_mlm.py
preprocessing, on the same corpus and the same tokenizer.

    python tools/bench_prepare.py --mb 50 [--corpus FILE ...] [--workers-list 1,2] [--rounds 1]
        [--vocab-size 10000] [--seq-len 64] [--labels static] [--keep DIR]

The corpus: the files given, or words from a Zipf distribution over a generated
vocabulary in documents of log-normally varied length (blank-line separated, 8
files). The tokenizer is trained once (by prepare, timed); then each contender runs
in a fresh process, given that tokenizer: `tokenizers` `encode_batch` alone (on its
own threads: the floor), `prepare --workers N` (encode, pack, write) and
`datasets.map(num_proc=N)` tokenizing lines and grouping them into blocks
(run_mlm.py without --line_by_line), for each N of --workers-list. It prints
seconds, MB/s, CPU-seconds per MB, CPU-seconds per MB outside `tokenizers` (the
contender's CPU time less encode_batch's) and the peak resident memory of the
largest process, then each worker count's speed-up over one worker.
Standalone: never imported by the package.
"""

import argparse
import contextlib
import json
import os
import resource
import shutil
import string
import subprocess
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


def _usage():
    """(wall-clock start, CPU seconds so far) of this process and its waited-for children."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _peak_mb():
    """The largest resident set of this process and of any of its children, MB. This
    process's is its VmHWM where Linux shows it: its ru_maxrss would count the bench's
    own process, which it was forked from."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with contextlib.suppress(OSError, IndexError):
        own = [
            int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")
        ][0]
    return max(own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024


def _documents(paths):
    from kroberta.text.textfiles import Source, iter_documents

    return iter_documents([Source.of(p) for p in paths])


def run_one(mode, workers, paths, tokenizer_path, out, args):
    """One measured run in this (fresh) process; prints a JSON line."""
    from kroberta.text.build import prepare

    start, cpu = time.perf_counter(), _usage()
    serial = None
    if mode == "prepare":
        m = prepare(
            paths,
            out,
            vocab_size=args.vocab_size,
            seq_len=args.seq_len,
            labels=args.labels,
            seed=args.seed,
            progress=False,
            overwrite=True,
            workers=workers,
            tokenizer=tokenizer_path,
        )
        # One process's work before the chunks (scan, cuts, plan) and after (joining the shards).
        serial = m["timing_s"]["tokenizer"] + m["timing_s"]["assemble"]
    elif mode == "tokenizers":  # encode_batch alone, on its own threads: the floor
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(tokenizer_path)
        batch, size = [], 0
        for doc in _documents(paths):
            batch.append(doc)
            size += len(doc)
            if size >= 1 << 20:
                tok.encode_batch_fast(batch, add_special_tokens=False)
                batch, size = [], 0
        tok.encode_batch_fast(batch, add_special_tokens=False)
    elif mode == "datasets":  # Hugging Face run_mlm.py's preprocessing: tokenize lines, group texts
        run_mlm_preprocessing(paths, tokenizer_path, workers, args.seq_len, out)
    print(
        json.dumps(
            {
                "seconds": time.perf_counter() - start,
                "cpu": _usage() - cpu,
                "peak_mb": _peak_mb(),
                "serial_s": serial,
            }
        )
    )


def run_mlm_preprocessing(paths, tokenizer_path, workers, seq_len, cache):
    """run_mlm.py without --line_by_line: the "text" loader's lines, `map(tokenize,
    batched, num_proc)`, then `map(group_texts)` into blocks of `seq_len`, with the
    same tokenizer (a `tokenizers.Tokenizer` called directly)."""
    import datasets
    from tokenizers import Tokenizer

    datasets.disable_progress_bars()
    raw = datasets.load_dataset("text", data_files=paths, split="train", cache_dir=cache)
    tok = Tokenizer.from_file(tokenizer_path)

    def tokenize(batch):
        encoded = tok.encode_batch_fast(batch["text"], add_special_tokens=True)
        return {
            "input_ids": [e.ids for e in encoded],
            "attention_mask": [e.attention_mask for e in encoded],
        }

    def group_texts(examples):
        joined = {k: sum(examples[k], []) for k in examples}
        length = len(joined["input_ids"]) // seq_len * seq_len
        return {
            k: [v[i : i + seq_len] for i in range(0, length, seq_len)] for k, v in joined.items()
        }

    tokenized = raw.map(
        tokenize, batched=True, num_proc=workers if workers > 1 else None, remove_columns=["text"]
    )
    tokenized.map(group_texts, batched=True, num_proc=workers if workers > 1 else None)


def measure(mode, workers, paths, tokenizer_path, out, args):
    """Runs `run_one` in a fresh Python process (its own peak memory and CPU time)."""
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--run",
        mode,
        "--workers",
        str(workers),
        "--tokenizer",
        tokenizer_path,
        "--out",
        out,
        "--seq-len",
        str(args.seq_len),
        "--vocab-size",
        str(args.vocab_size),
        *(["--labels", args.labels] if args.labels else []),
        *paths,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{mode} x{workers} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=float, default=50.0, help="corpus size in MB (default 50)")
    parser.add_argument(
        "--corpus", nargs="*", help="these text files instead of a generated corpus"
    )
    parser.add_argument("--vocab-size", type=int, default=10000)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--labels", choices=["static"], default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--workers-list", default="1,2", help="worker counts to compare (default 1,2)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every contender this many times, interleaved, and keep each one's fastest",
    )
    parser.add_argument("--keep", help="keep the corpus and output in this directory")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # one measured run (internal)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()

    # Run from a checkout without installing: the repository root holds kroberta/.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if args.run:
        return run_one(args.run, args.workers, args.paths, args.tokenizer, args.out, args)
    from kroberta.text.build import prepare  # after argparse: --help stays fast

    root = args.keep or tempfile.mkdtemp(prefix="bench_prepare_")
    os.makedirs(os.path.join(root, "corpus"), exist_ok=True)
    try:
        if args.corpus:
            paths = [os.path.abspath(p) for p in args.corpus]
        else:
            t0 = time.perf_counter()
            paths = write_corpus(os.path.join(root, "corpus"), args.mb, args.seed)
            print(f"generated in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        mb = sum(os.path.getsize(p) for p in paths) / 1e6
        # One tokenizer for every contender, trained (and timed) once by prepare itself.
        t0 = time.perf_counter()
        m = prepare(
            paths,
            os.path.join(root, "trained"),
            vocab_size=args.vocab_size,
            seq_len=args.seq_len,
            progress=False,
            overwrite=True,
            workers=1,
        )
        tokenizer_path = os.path.join(root, "trained", "tokenizer.json")
        print(
            f"{mb:.1f} MB in {len(paths)} file(s), {os.cpu_count()} CPUs; tokenizer trained in "
            f"{m['timing_s']['tokenizer']:.1f}s on {m['source']['tokenizer_sample_bytes'] / 1e6:.1f} MB"
        )
        rows = [("tokenizers encode_batch", "tokenizers", 1)]
        for n in map(int, args.workers_list.split(",")):
            rows += [
                (f"prepare --workers {n}", "prepare", n),
                (f"datasets.map num_proc={n}", "datasets", n),
            ]
        results = {}
        for round_ in range(
            args.rounds
        ):  # interleaved: a load that comes and goes hits every contender alike
            for name, mode, n in rows:
                out = os.path.join(
                    root, f"{mode}-{n}-{round_}"
                )  # fresh: datasets would reuse its cache
                r = measure(mode, n, paths, tokenizer_path, out, args)
                shutil.rmtree(out, ignore_errors=True)
                print(f"  {name}: {r}", file=sys.stderr)
                if name not in results or r["seconds"] < results[name]["seconds"]:
                    results[name] = r  # the least disturbed round
        floor = results["tokenizers encode_batch"]["cpu"]
        print(
            f"{'':<26}{'seconds':>9}{'MB/s':>8}{'CPU s/MB':>10}{'outside tok.':>14}{'peak MB':>9}"
        )
        for name, r in results.items():
            outside = (r["cpu"] - floor) / mb if name != "tokenizers encode_batch" else 0.0
            print(
                f"{name:<26}{r['seconds']:>9.1f}{mb / r['seconds']:>8.2f}{r['cpu'] / mb:>10.3f}{outside:>14.3f}"
                f"{r['peak_mb']:>9.0f}"
            )
        for name, r in results.items():
            if r["serial_s"] is not None:
                print(
                    f"{name}: serial part {r['serial_s']:.2f}s, {100 * r['serial_s'] / r['cpu']:.1f}% of its CPU time"
                )
        one = results.get("prepare --workers 1")
        for name, r in results.items():
            if one and name.startswith("prepare --workers") and name != "prepare --workers 1":
                print(f"{name}: {one['seconds'] / r['seconds']:.2f}x one worker")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
