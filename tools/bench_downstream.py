"""Does pretraining pay, and which small-budget recipe makes it pay? An ablation.

Builds, at run time and from text this machine has but this repository does not hold,
a pretraining corpus and six-way classification tasks whose texts the pretraining
never sees:

  man      man-page passages -> section (1, 2, 3, 5, 7, 8); pages are split by a hash
           of their name between pretraining, the task's training and its validation.
  debian   Debian package descriptions (`apt-cache dumpavail`) -> archive section
           (admin, games, net, science, text, utils); packages split the same way.
  stdlib   the embedded task (`kroberta.finetune` with no data): docstrings -> standard
           library package, split by module; the corpus leaves its validation modules out
           (`kroberta.text.corpus.held_out_files`).

Then, per variant (each changes one thing from the current defaults, at equal
pretraining compute: same model, steps, batch and sequence length), pretrains a model
and fine-tunes it on every task; a random initialisation of the same shape and
tokenizer is fine-tuned too (once per task: it does not depend on the variant). Each
start gets its own learning-rate grid, widened by x3 steps while its best rate (the
highest median over seeds) is at an edge (at most `--widen` times). Prints, per task,
each start's best rate, the median [min, max] over seeds, and pretrained - random.

`--pooling` and `--epochs` change fine-tuning only (both starts, a row each): the
classifier's head reading `<s>` ("first", the default) or the mean of the tokens' states
("mean"), and the passes over the task's training set. A finished variant's pretrained
run is reused.

Results are appended to <out>/results.jsonl as they finish: a re-run skips what is
there (pretrained runs resume too), so it can be stopped and continued.

  python tools/bench_downstream.py --out /tmp/bench-downstream --steps 1800 \
      --variants baseline mask30 onecycle
  python tools/bench_downstream.py --out /tmp/bench-downstream --steps 1800 \
      --variants baseline --pooling mean --epochs 3 5
"""

import argparse
import gzip
import itertools
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
import zlib

SECTIONS_MAN = ("1", "2", "3", "5", "7", "8")
SECTIONS_DEBIAN = ("admin", "games", "net", "science", "text", "utils")
PASSAGE_WORDS = 48
MAN_SECTION_BYTES = 1_500_000  # pretraining text per man section: enough for minutes

# Each changes one thing from "baseline" (the default job's recipe at this shape).
VARIANTS = {
    "baseline": {},
    "mask30": {"data.mask_rate": 0.3},
    "dropout10": {"model.dropout": 0.1},
    "onecycle": {
        "train.warmup_steps": "half"
    },  # Cramming's one-cycle: peak mid-budget, 0 at its end
    "lr1e-3": {"train.learning_rate": 1e-3},
    "mask30+onecycle": {"data.mask_rate": 0.3, "train.warmup_steps": "half"},
    # The same pair on a second pretraining seed: is its gain more than one run's luck?
    "mask30+onecycle+seed1": {"data.mask_rate": 0.3, "train.warmup_steps": "half", "train.seed": 1},
    # Cramming's large batch through accumulation, at equal compute: 4x the sequences a step
    # (gradients of 4 micro-batches summed), a quarter of the steps, the same tokens.
    "mask30+onecycle+batch4x": {
        "data.mask_rate": 0.3,
        "train.warmup_steps": "half",
        "train.gradient_accumulation_steps": 4,
        "train.steps": "quarter",
    },
}


def bucket(name: str) -> str:
    """pretrain (3 in 5), train or dev (1 in 5 each), from a stable hash of the name."""
    return ("dev", "train", "pretrain", "pretrain", "pretrain")[zlib.crc32(name.encode()) % 5]


# ---------------------------------------------------------------- text sources
_ROFF_TEXT_MACROS = re.compile(r"^[.'](?:B|I|BI|BR|IR|RB|RI|IB|SM|SB|TP|IP|HP|PP|LP|P)\b\s*(.*)$")


def roff_text(raw: str) -> str:
    """The prose of a roff man page: requests dropped (their arguments kept for font
    macros), escapes removed. Approximate, and enough for a bag of passages."""
    out = []
    for line in raw.splitlines():
        if line.startswith((".", "'")):
            match = _ROFF_TEXT_MACROS.match(line)
            if not match:
                continue
            line = match.group(1).replace('"', "")
        line = re.sub(r"\\f(?:\[[^\]]*\]|\(..|.)", "", line)
        line = re.sub(r"\\\*?(?:\[[^\]]*\]|\(..)", " ", line)
        line = line.replace("\\-", "-").replace("\\e", "\\").replace("\\&", "")
        line = re.sub(r"\\.", "", line)
        out.append(line)
    return " ".join(" ".join(out).split())


def man_pages():
    """(name, section, text) of the English man pages of SECTIONS_MAN."""
    for section in SECTIONS_MAN:
        folder = f"/usr/share/man/man{section}"
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            try:
                with gzip.open(os.path.join(folder, name), "rt", errors="replace") as f:
                    raw = f.read()
            except (OSError, EOFError):
                continue
            if raw.lstrip().startswith(".so "):  # a link to another page
                continue
            text = roff_text(raw)
            if len(text.split()) >= PASSAGE_WORDS:
                yield name, section, text


def debian_packages():
    """(package, section, description) of `apt-cache dumpavail`, one per package."""
    dump = subprocess.run(
        ["apt-cache", "dumpavail"], capture_output=True, text=True, check=True
    ).stdout
    seen = set()
    for stanza in dump.split("\n\n"):
        fields = dict(
            line.split(": ", 1)
            for line in stanza.splitlines()
            if ": " in line and not line.startswith(" ")
        )
        name, section = fields.get("Package"), fields.get("Section", "").split("/")[-1]
        if name and name not in seen and fields.get("Description"):
            seen.add(name)
            yield name, section, fields["Description"]


def passages(text: str, rng, most: int) -> list:
    words = text.split()
    starts = list(range(0, len(words) - PASSAGE_WORDS + 1, PASSAGE_WORDS))
    rng.shuffle(starts)
    return [" ".join(words[s : s + PASSAGE_WORDS]) for s in sorted(starts[:most])]


def build_data(out: str, per_class: tuple, seed: int = 0) -> dict:
    """Writes <out>/corpus.txt and <out>/<task>-{train,dev}.jsonl; returns their sizes."""
    from kroberta.text import corpus

    rng = random.Random(seed)
    man_bytes = dict.fromkeys(SECTIONS_MAN, 0)
    documents, tasks = [], {"man": {"train": {}, "dev": {}}, "debian": {"train": {}, "dev": {}}}
    for name, section, text in man_pages():
        part = bucket("man/" + name)
        if part == "pretrain":
            if man_bytes[section] < MAN_SECTION_BYTES:  # man1 alone would be 40 MB
                documents.append(text)
                man_bytes[section] += len(text)
        else:
            tasks["man"][part].setdefault(f"man{section}", []).extend(passages(text, rng, 2))
    descriptions = []
    for name, section, text in debian_packages():
        part = bucket("deb/" + name)
        if part == "pretrain":
            descriptions.append(text)
        elif section in SECTIONS_DEBIAN:
            tasks["debian"][part].setdefault(section, []).append(text)
    # Descriptions are one line each: a document of 20 of them (as a package list reads).
    rng.shuffle(descriptions)
    documents += [" \n".join(descriptions[i : i + 20]) for i in range(0, len(descriptions), 20)]
    # The standard library's docstrings, less the embedded task's validation modules.
    documents += list(corpus.stdlib_docstrings(exclude=corpus.held_out_files()))
    rng.shuffle(documents)
    with open(os.path.join(out, "corpus.txt"), "w", encoding="utf-8") as f:
        for doc in documents:
            text = "\n".join(line for line in doc.splitlines() if line.strip())
            if text:
                f.write(text + "\n\n")
    sizes = {
        "corpus_bytes": os.path.getsize(os.path.join(out, "corpus.txt")),
        "corpus_documents": len(documents),
    }
    for task, parts in tasks.items():
        for part, cap in zip(("train", "dev"), per_class):
            rows = []
            for label in sorted(parts[part]):
                texts = parts[part][label]
                rng.shuffle(texts)
                rows += [{"text": t, "label": label} for t in texts[:cap]]
            rng.shuffle(rows)
            with open(os.path.join(out, f"{task}-{part}.jsonl"), "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
            sizes[f"{task}_{part}"] = len(rows)
    return sizes


# ---------------------------------------------------------------- pretraining
def pretrain(args, variant: str) -> str:
    import kroberta

    run_dir = os.path.join(args.out, "runs", variant)
    if os.path.isfile(os.path.join(run_dir, "model.weights.h5")):
        return run_dir
    overrides = dict(VARIANTS[variant])
    if overrides.get("train.steps") == "quarter":
        overrides["train.steps"] = args.steps // 4
    steps = overrides.setdefault("train.steps", args.steps)
    if overrides.get("train.warmup_steps") == "half":
        overrides["train.warmup_steps"] = steps // 2
    config = kroberta.load_config(
        None,
        {
            "run_dir": run_dir,
            "data.dir": os.path.join(args.out, "prepared"),
            "model.vocabulary_size": args.vocab,
            "model.max_sequence_length": args.seq_len,
            "model.num_layers": args.layers,
            "model.hidden_dim": args.hidden,
            "model.intermediate_dim": 4 * args.hidden,
            "model.num_heads": max(1, args.hidden // 32),
            "train.steps": args.steps,
            "train.batch_size_per_device": args.batch,
            # The baseline the variants change: 100 warmup steps of 1800 and RoBERTa's 15%.
            "train.warmup_steps": max(1, args.steps // 18),
            "train.warmup_fraction": 0,
            "data.mask_rate": 0.15,
            "train.log_every": 50 if steps % 50 == 0 else steps,
            "train.eval_every": steps,
            "train.checkpoint_every": steps,
            "train.eval_steps": 20,
            "train.trackers": [],
            **overrides,
        },
    )
    started = time.perf_counter()
    summary = kroberta.train(config)
    if summary["final_step"] < steps:  # stopped (SIGTERM, early stop): no fair comparison
        sys.exit(f"{variant}: pretraining stopped at step {summary['final_step']} of {steps}")
    record(
        args,
        {
            "kind": "pretrain",
            "variant": variant,
            "seconds": time.perf_counter() - started,
            "validation": last_validation(run_dir),
        },
    )
    return run_dir


def last_validation(run_dir: str) -> dict:
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    rows = [r for r in rows if r.get("split") == "validation"]
    return {k: rows[-1][k] for k in ("step", "loss", "masked_accuracy")} if rows else {}


# ---------------------------------------------------------------- fine-tuning
def median_by_rate(trials) -> dict:
    by_rate = {}
    for rate, score in trials:
        by_rate.setdefault(rate, []).append(score)
    return {rate: statistics.median(scores) for rate, scores in by_rate.items()}


def tuned(run_trials, grid: list, widen: int) -> tuple:
    """Runs `run_trials(rates) -> [(rate, score)]` on `grid`, then widens it by x3 at the
    edge holding the best median, until the best is inside (or `widen` times)."""
    trials = run_trials(list(grid))
    rates = sorted(grid)
    note = ""
    for _ in range(widen + 1):
        medians = median_by_rate(trials)
        best = max(rates, key=lambda r: medians[r])
        if rates[0] < best < rates[-1]:
            note = ""
            break
        new = best * 3 if best == rates[-1] else best / 3
        note = f"best at the edge {best:g}"
        if _ == widen:
            break
        trials += run_trials([new])
        rates = sorted(rates + [new])
    return trials, note


def task_arguments(args, task: str) -> dict:
    if task == "stdlib":
        return {"task": None}
    return {
        "task": task,
        "data": os.path.join(args.out, f"{task}-train.jsonl"),
        "validation": os.path.join(args.out, f"{task}-dev.jsonl"),
    }


def finetune_start(args, model_for_seed, task: str, epochs: int, pooling: str) -> dict:
    """Tunes one start on one task: {"trials": [(rate, score, seed)], best rate, median...}."""
    import kroberta

    found = []

    def run_trials(rates):
        scores = []
        for seeds, model in model_for_seed():
            result = kroberta.finetune(
                model,
                **task_arguments(args, task),
                learning_rates=rates,
                seeds=seeds,
                epochs=epochs,
                pooling=pooling,
                max_length=args.seq_len,
            )
            for trial in result.trials:
                value = trial.scores[result.split][result.metric]
                scores.append((trial.learning_rate, value))
                found.append((trial.learning_rate, value, trial.seed))
        return scores

    trials, note = tuned(run_trials, args.grid, args.widen)
    medians = median_by_rate(trials)
    best = max(medians, key=medians.get)
    at_best = [s for r, s in trials if r == best]
    return {
        "trials": found,
        "best_rate": best,
        "median": medians[best],
        "low": min(at_best),
        "high": max(at_best),
        "grid": sorted(medians),
        "note": note,
    }


def probe_scores(args, model, task: str) -> float:
    """The frozen model's mean-pooled linear probe (`kroberta.pretraining.probe`) accuracy."""
    from kroberta.downstream.tasks import read_task
    from kroberta.pretraining import probe

    a = task_arguments(args, task)
    spec, names, train, evaluation = read_task(
        a["task"], a.get("data"), a.get("validation"), ("text",), "label", "classification"
    )
    return probe.linear_probe(model, spec, train, evaluation["validation"], names, args.seq_len)[
        spec.metric
    ]


def pretrained_models(run_dir: str, seeds: int):
    import kroberta

    model = kroberta.load(run_dir)
    return lambda: [(list(range(seeds)), model)]  # one start: the seeds draw head and order


def random_models(run_dir: str, seeds: int):
    """A fresh model of the run's shape and tokenizer per seed (its own initialisation)."""
    import kroberta
    from kroberta.model.mlm import build_model

    shape = kroberta.load(run_dir)

    def models():
        for seed in range(seeds):
            yield (
                [seed],
                build_model(
                    shape.kroberta_config.model,
                    seed=10_000 + seed,
                    config=shape.kroberta_config,
                    tokenizer=shape.tokenizer,
                ),
            )

    return models


# ---------------------------------------------------------------- results
def record(args, row: dict):
    with open(os.path.join(args.out, "results.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def recorded(args) -> list:
    path = os.path.join(args.out, "results.jsonl")
    return [json.loads(line) for line in open(path)] if os.path.isfile(path) else []


def done(args, **key) -> dict | None:
    for row in recorded(args):
        if all(row.get(k) == v for k, v in key.items()):
            return row
    return None


def table(args):
    rows = recorded(args)
    pre = {r["variant"]: r for r in rows if r["kind"] == "pretrain"}
    print("\npretraining (equal compute): variant, validation masked accuracy, seconds")
    for variant, r in pre.items():
        print(
            f"  {variant:18s} {100 * r['validation'].get('masked_accuracy', float('nan')):5.1f}%"
            f"  {r['seconds']:6.0f} s"
        )
    probes = [r for r in rows if r["kind"] == "probe"]
    if probes:
        print("\nfrozen mean-pooled linear probe, validation accuracy (random: one per seed)")
        for r in probes:
            print(
                f"  {r['task']:8s} {r['start']:18s} "
                + " / ".join(f"{100 * s:.1f}" for s in r["scores"])
            )
    fine = [r for r in rows if r["kind"] == "finetune"]
    for task in dict.fromkeys(r["task"] for r in fine):
        print(f"\n{task}: median [min, max] over seeds at the start's best rate (grid widened x3)")
        print(
            f"  {'start':28s} {'best rate':>9s}  {'median':>6s}  {'[min, max]':14s}  "
            f"{'- random':>8s}"
        )
        for r in (r for r in fine if r["task"] == task):
            random_row = next(
                (
                    x
                    for x in fine
                    if x["task"] == task
                    and x["start"] == "random"
                    and x["epochs"] == r["epochs"]
                    and x.get("pooling") == r.get("pooling")
                ),
                None,
            )
            gap = (
                f"{100 * (r['median'] - random_row['median']):+8.1f}"
                if random_row and r["start"] != "random"
                else ""
            )
            name = (
                f"{r['start']} (e{r['epochs']}"
                + (f", {r['pooling']}" if r.get("pooling") else "")
                + ")"
            )
            print(
                f"  {name:28s} {r['best_rate']:9.0e}  {100 * r['median']:6.1f}  "
                f"[{100 * r['low']:.1f}, {100 * r['high']:.1f}]  {gap}"
                + (f"  ({r['note']})" if r["note"] else "")
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="/tmp/bench-downstream")
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["baseline", "mask30", "dropout10", "onecycle"],
        choices=list(VARIANTS),
    )
    parser.add_argument(
        "--tasks", nargs="+", default=["man", "debian"], choices=["man", "debian", "stdlib"]
    )
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument(
        "--per-class",
        type=int,
        nargs=2,
        default=(120, 60),
        help="task examples per class: training, validation",
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--epochs", type=int, nargs="+", default=[3], help="fine-tuning epochs to try (each a row)"
    )
    parser.add_argument(
        "--pooling",
        nargs="+",
        default=["first"],
        choices=["first", "mean"],
        help="what the classifier's head reads, `<s>` or the tokens' mean "
        "(each a row; both starts)",
    )
    parser.add_argument("--grid", type=float, nargs="+", default=[3e-4, 1e-3, 3e-3])
    parser.add_argument("--widen", type=int, default=2, help="most x3 widenings per start")
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.table_only:
        return table(args)
    import logging

    logging.basicConfig(level=logging.WARNING)
    if not os.path.isfile(os.path.join(args.out, "prepared", "manifest.json")):
        sizes = build_data(args.out, tuple(args.per_class))
        print("data:", sizes, flush=True)
        import kroberta

        kroberta.prepare(
            [os.path.join(args.out, "corpus.txt")],
            os.path.join(args.out, "prepared"),
            vocab_size=args.vocab,
            seq_len=args.seq_len,
            validation_fraction=0.02,
            progress=False,
        )
    for variant in args.variants:
        run_dir = pretrain(args, variant)
        print(f"pretrained {variant}: {last_validation(run_dir)}", flush=True)
        starts = [("random", random_models)] if variant == args.variants[0] else []
        starts.append((variant, pretrained_models))
        for start, make in starts:
            for task in args.tasks:
                if not done(args, kind="probe", start=start, task=task):
                    scores = [
                        probe_scores(args, model, task)
                        for seeds, model in make(run_dir, args.seeds)()
                    ]
                    record(args, {"kind": "probe", "start": start, "task": task, "scores": scores})
                for epochs, pooling in itertools.product(args.epochs, args.pooling):
                    # A row names its pooling only when it is not "first" (the rows
                    # recorded before the option read `<s>`).
                    key = {"pooling": pooling} if pooling != "first" else {}
                    if done(
                        args,
                        kind="finetune",
                        start=start,
                        task=task,
                        epochs=epochs,
                        pooling=key.get("pooling"),
                    ):
                        continue
                    started = time.perf_counter()
                    result = finetune_start(args, make(run_dir, args.seeds), task, epochs, pooling)
                    record(
                        args,
                        {
                            "kind": "finetune",
                            "start": start,
                            "task": task,
                            "epochs": epochs,
                            **key,
                            "seconds": time.perf_counter() - started,
                            **result,
                        },
                    )
                    print(
                        f"{start} on {task} (epochs {epochs}, {pooling}): "
                        f"{result['median']:.3f} at "
                        f"{result['best_rate']:g} [{result['low']:.3f}, {result['high']:.3f}]",
                        flush=True,
                    )
    table(args)


if __name__ == "__main__":
    sys.exit(main())
