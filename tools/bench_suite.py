"""Does pretraining pay on tasks no one here chose? The downstream suite, at 1x, 2x, 4x.

Builds the suite's tasks (tools/suite_tasks.py: seven classification tasks from six
sources on this machine, split by a stable hash of their units so no validation text is
pretrained on) and one pretraining corpus holding each task's share (its own training
texts, or only neighbouring text). Then runs the recipe the docs give a user's corpus:

  python -m kroberta.prepare --input corpus.txt --out prepared --vocab-size 4096 --seq-len 64
  python -m kroberta.train --config small --data.dir=prepared --train.steps=<1800 x budget>
  python -m kroberta.finetune --run <run> --data T-train.jsonl --validation T-dev.jsonl \
      --baseline --epochs 5

for each budget (`--budgets 1 2 4`: 1800, 3600 and 7200 steps of `--config small`; a
duration such as `15m` runs small.toml as it ships, its `train.time_budget` set to it), and on
each task: both starts' median [min, max] over seeds at their own best rate (each grid
widened x3 while its best is at an edge), the difference with its bootstrap interval
(`kroberta.downstream.results.compare`), and the frozen probe (`bench_downstream.probe_scores`)
of the pretrained model against a random initialisation (one per seed). The random
start's trials do not depend on the budget: a budget reuses those another one ran.

`--recipe NAME=VALUE ...` fine-tunes with the recipe's optional steps
(`kroberta.FinetuneConfig`'s `probe_epochs`, `layer_decay`, `adapt_steps`,
`reinit_layers`), both starts alike, into finetune/<budget>-<recipe>/; the table then
sets each recipe beside the plain one on the tasks both ran: how it moves the difference
and the pretrained start's own score. Choose a recipe on some tasks (`--tasks`) and
judge it on the others.

Results go to <out>/results.jsonl as they finish; a re-run skips what is there (a
fine-tune resumes its finished trials), so it can be stopped and continued.

  python tools/bench_suite.py --out /tmp/suite --budgets 1 2 4
  python tools/bench_suite.py --out /tmp/suite --budgets 15m
  python tools/bench_suite.py --out /tmp/suite --budgets 1 --tasks man --recipe adapt_steps=300
  python tools/bench_suite.py --out /tmp/suite --table-only
"""

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_downstream as common  # noqa: E402
import suite_tasks  # noqa: E402

BASE_STEPS = 1800  # small.toml before its 15-minute budget: the steps given override it


def budget_arg(text: str):
    """ "2" -> 2 (x BASE_STEPS steps); "15m" -> "15m" (small.toml's time budget set to it)."""
    if text.isdigit() and int(text) > 0:
        return int(text)
    from kroberta.config import parse_duration

    try:
        parse_duration(text)
    except ValueError as error:  # it says what is wrong with the text
        message = f"a multiple of {BASE_STEPS} steps or a duration: {error}"
        raise argparse.ArgumentTypeError(message) from None
    return text


def budget_name(budget) -> str:
    """2 -> "2x", "15m" -> "15m": the budget in run and folder names and tables."""
    return f"{budget}x" if isinstance(budget, int) else budget


def budget_order(budget):
    """Step multiples first, by size, then time budgets, by duration."""
    from kroberta.config import parse_duration

    return (0, budget) if isinstance(budget, int) else (1, parse_duration(budget))


def build(args) -> dict:
    """Writes <out>/<task>-{train,dev}.jsonl, <out>/corpus.txt and <out>/tasks.json."""
    tasks = suite_tasks.build_tasks(suite_tasks.SOURCES, only=args.tasks)
    for task in tasks:
        for part in ("train", "dev"):
            with open(os.path.join(args.out, f"{task.name}-{part}.jsonl"), "w") as f:
                f.writelines(
                    json.dumps({"text": text, "label": label}) + "\n"
                    for _, label, text in getattr(task, part)
                )
    documents = suite_tasks.corpus_documents(tasks, random.Random(1))
    with open(os.path.join(args.out, "corpus.txt"), "w", encoding="utf-8") as f:
        f.writelines(doc + "\n\n" for doc in documents)
    described = {
        t.name: {
            "source": t.source,
            "few_shot": t.few_shot,
            "semantic": t.semantic,
            "corpus": "own text" if t.own_text else "neighbouring",
            "labels": sorted({r[1] for r in t.train}),
            "train": len(t.train),
            "dev": len(t.dev),
            "corpus_texts": len(t.corpus),
            "corpus_bytes": sum(len(x) for _, x in t.corpus),
        }
        for t in tasks
    }
    described["corpus"] = {
        "documents": len(documents),
        "bytes": os.path.getsize(os.path.join(args.out, "corpus.txt")),
    }
    with open(os.path.join(args.out, "tasks.json"), "w") as f:
        json.dump(described, f, indent=1)
    return described


def pretrain(args, budget) -> str:
    """Trains `--config small` for `budget` into <out>/runs/small-<budget>/ (or finds it
    trained) and records its steps, minutes and validation (once)."""
    import kroberta
    from kroberta import run_layout

    run_dir = os.path.join(args.out, "runs", f"small-{budget_name(budget)}")
    overrides = {"run_dir": run_dir, "data.dir": os.path.join(args.out, "prepared")}
    overrides.update(
        {"train.steps": BASE_STEPS * budget}
        if isinstance(budget, int)
        else {"train.time_budget": budget}
    )
    seconds = None  # a run found trained has its minutes in its own log
    if not os.path.isfile(os.path.join(run_dir, "model.weights.h5")):
        started = time.perf_counter()
        kroberta.train(kroberta.load_config("small", {**overrides, "train.trackers": []}))
        seconds = time.perf_counter() - started
    elif common.done(args, kind="pretrain", budget=budget):
        return run_dir
    # The steps the run was given or its time budget fixed (recorded in its config.toml).
    steps = run_layout.load_run_config(run_dir).train.steps
    validation = common.last_validation(run_dir)
    if validation.get("step") != steps:
        last = validation.get("step", "none")
        sys.exit(
            f"{budget_name(budget)}: pretraining's last evaluation is at step {last} of {steps}"
        )
    common.record(
        args,
        {
            "kind": "pretrain",
            "budget": budget,
            "steps": steps,
            "seconds": seconds,
            "validation": validation,
        },
    )
    return run_dir


def recipe_label(recipe: dict) -> str:
    """ "adapt_steps=300,layer_decay=0.8" ("" for the plain recipe)."""
    return ",".join(f"{name}={value}" for name, value in sorted(recipe.items()))


def parse_recipe(settings: list) -> dict:
    """["adapt_steps=300"] -> {"adapt_steps": 300}, checked by `kroberta.FinetuneConfig`."""
    from kroberta.downstream.settings import RECIPE_OPTIONS, FinetuneConfig
    from kroberta.errors import InputError

    recipe = {}
    for setting in settings:
        name, _, value = setting.partition("=")
        if name not in RECIPE_OPTIONS or not value:
            sys.exit(
                f"--recipe {setting}: expected NAME=VALUE, NAME one of {', '.join(RECIPE_OPTIONS)}"
            )
        recipe[name] = float(value) if name == "layer_decay" else int(value)
    try:
        FinetuneConfig(**recipe)  # refuses a value no fine-tune takes, naming it
    except InputError as error:
        sys.exit(f"--recipe {error}")
    return recipe


def finetune_folder(args, budget, task: str) -> str:
    label = recipe_label(args.recipe)
    name = budget_name(budget) + (f"-{label}" if label else "")
    return os.path.join(args.out, "finetune", name, task)


def _reuse_random_trials(args, budget, task: str, folder: str):
    """Copies the random-start trials of a budget that already ran `task` with this recipe
    into `folder` (same task, tokenizer, shape, seeds and recipe: `TrialLog` checks the
    settings and refuses others)."""
    recipe = args.recipe or None
    ran = [
        r["budget"]
        for r in common.recorded(args)
        if r["kind"] == "finetune" and r["task"] == task and r.get("recipe") == recipe
    ]
    if os.path.exists(folder) or not ran:
        return
    first = finetune_folder(args, ran[0], task)
    os.makedirs(os.path.join(folder, "trials"))
    with open(os.path.join(first, "trials.jsonl")) as f:
        random_lines = [line for line in f if json.loads(line).get("grid") == "random"]
    with open(os.path.join(folder, "trials.jsonl"), "w") as out:
        out.writelines(random_lines)
    for name in os.listdir(os.path.join(first, "trials")):
        if name.startswith("random-"):
            shutil.copy(os.path.join(first, "trials", name), os.path.join(folder, "trials", name))


def _start(result) -> dict:
    split = result.split
    return {
        "best_rate": result.best_learning_rate,
        "median": result.median[split],
        "low": result.low[split],
        "high": result.high[split],
        "rates": sorted({t.learning_rate for t in result.trials}),
    }


def finetune_task(args, budget, run_dir: str, task: str):
    import kroberta

    recipe = args.recipe or None  # the plain recipe's rows have none
    if common.done(args, kind="finetune", budget=budget, task=task, recipe=recipe):
        return
    if not common.done(args, kind="probe", start="random", task=task):
        scores = [
            common.probe_scores(args, model, task)
            for _, model in common.random_models(run_dir, args.seeds)()
        ]
        common.record(args, {"kind": "probe", "start": "random", "task": task, "scores": scores})
    if not common.done(args, kind="probe", budget=budget, task=task):
        score = common.probe_scores(args, kroberta.load(run_dir), task)
        common.record(
            args,
            {
                "kind": "probe",
                "start": "pretrained",
                "budget": budget,
                "task": task,
                "scores": [score],
            },
        )
    folder = finetune_folder(args, budget, task)
    _reuse_random_trials(args, budget, task, folder)
    started = time.perf_counter()
    a = common.task_arguments(args, task)
    result = kroberta.finetune(
        run_dir,
        task,
        a["data"],
        a["validation"],
        seeds=args.seeds,
        epochs=args.epochs,
        baseline=True,
        out=folder,
        max_length=args.seq_len,
        **args.recipe,
    )
    row = {
        "kind": "finetune",
        "budget": budget,
        "task": task,
        "epochs": args.epochs,
        "seeds": args.seeds,
        "seconds": time.perf_counter() - started,
        "pretrained": _start(result),
        "random": _start(result.baseline),
        "comparison": {k: result.comparison[k] for k in ("difference", "low", "high", "examples")},
    }
    if recipe:
        row["recipe"] = recipe
    common.record(args, row)
    print(
        f"{budget_name(budget)} {recipe_label(args.recipe)} {task}: {format_row(row)}", flush=True
    )


def _pct(start: dict) -> str:
    return (
        f"{100 * start['median']:.1f} [{100 * start['low']:.1f}, "
        f"{100 * start['high']:.1f}] at {start['best_rate']:g}"
    )


def format_row(row: dict) -> str:
    c = row["comparison"]
    return (
        f"pretrained {_pct(row['pretrained'])}, random {_pct(row['random'])}: "
        f"{100 * c['difference']:+.1f} [{100 * c['low']:+.1f}, {100 * c['high']:+.1f}]"
    )


def table(args):
    rows = common.recorded(args)
    described = json.load(open(os.path.join(args.out, "tasks.json")))
    steps = {}  # budget -> the steps it trained
    for r in (r for r in rows if r["kind"] == "pretrain"):
        v, steps[r["budget"]] = r["validation"], r["steps"]
        minutes = (
            "its minutes in its log" if r["seconds"] is None else f"{r['seconds'] / 60:.1f} min"
        )
        print(
            f"pretraining {budget_name(r['budget'])} ({r['steps']} steps): {minutes}, "
            f"validation masked accuracy {100 * v.get('masked_accuracy', float('nan')):.1f}%"
        )
    probes = {
        (r["start"], r.get("budget"), r["task"]): r["scores"] for r in rows if r["kind"] == "probe"
    }
    fine = [r for r in rows if r["kind"] == "finetune" and "recipe" not in r]
    for budget in sorted({r["budget"] for r in fine}, key=budget_order):
        at = [r for r in fine if r["budget"] == budget]
        print(
            f"\n{budget_name(budget)} ({steps.get(budget)} steps): | task | kind | random | pretrained | "
            "pretrained - random [95%] | probe: pretrained / random"
        )
        for r in at:
            d = described[r["task"]]
            kind = ", ".join(
                [d["corpus"]] + ["few-shot"] * d["few_shot"] + ["semantic"] * d["semantic"]
            )
            c = r["comparison"]
            random_probe = "/".join(
                f"{100 * s:.1f}" for s in probes.get(("random", None, r["task"]), [])
            )
            pre_probe = probes.get(("pretrained", budget, r["task"]), [float("nan")])[0]
            print(
                f"| {r['task']} | {kind} | {_pct(r['random'])} | {_pct(r['pretrained'])} | "
                f"**{100 * c['difference']:+.1f}** [{100 * c['low']:+.1f}, "
                f"{100 * c['high']:+.1f}] | {100 * pre_probe:.1f} / {random_probe} |"
            )
        differences = {r["task"]: r["comparison"]["difference"] for r in at}
        worst = min(differences, key=differences.get)
        print(
            f"suite at {budget_name(budget)}: median difference "
            f"{100 * statistics.median(differences.values()):+.1f} over {len(at)} tasks; "
            f"worst {worst} {100 * differences[worst]:+.1f}"
        )
    budget_axis(fine, steps)
    recipes([r for r in rows if r["kind"] == "finetune"])


def recipes(rows: list):
    """Each recipe beside the plain one, at the same budget, on the tasks both ran: the
    change of the difference (pretrained - random) and of the pretrained start's median."""
    plain = {(r["budget"], r["task"]): r for r in rows if "recipe" not in r}
    tried = [r for r in rows if "recipe" in r and (r["budget"], r["task"]) in plain]
    for label in dict.fromkeys(recipe_label(r["recipe"]) for r in tried):
        at = [r for r in tried if recipe_label(r["recipe"]) == label]
        print(
            f"\nrecipe {label}: | budget | task | pretrained - random: plain -> recipe "
            "[95%] | pretrained start: plain -> recipe | random start: plain -> recipe"
        )
        moved = {}
        for r in at:
            p, c = plain[r["budget"], r["task"]], r["comparison"]
            moved[r["budget"], r["task"]] = 100 * (c["difference"] - p["comparison"]["difference"])
            print(
                f"| {budget_name(r['budget'])} | {r['task']} | "
                f"{100 * p['comparison']['difference']:+.1f} -> "
                f"**{100 * c['difference']:+.1f}** [{100 * c['low']:+.1f}, "
                f"{100 * c['high']:+.1f}] | {100 * p['pretrained']['median']:.1f} -> "
                f"{100 * r['pretrained']['median']:.1f} | {100 * p['random']['median']:.1f} "
                f"-> {100 * r['random']['median']:.1f} |"
            )
        worst = min(moved, key=moved.get)
        print(
            f"recipe {label} over {len(at)} tasks: the difference moves by a median "
            f"{statistics.median(moved.values()):+.1f}; most against it: "
            f"{budget_name(worst[0])} {worst[1]} {moved[worst]:+.1f}"
        )


def budget_axis(fine: list, steps: dict):
    """pretrained - random per task and budget, and the suite's median at each budget."""
    budgets = sorted({r["budget"] for r in fine}, key=budget_order)
    if len(budgets) < 2:
        return
    print(
        "\nthe budget axis: pretrained - random | task | "
        + " | ".join(f"{budget_name(b)} ({steps.get(b)} steps)" for b in budgets)
    )
    cell = {(r["task"], r["budget"]): 100 * r["comparison"]["difference"] for r in fine}
    for task in dict.fromkeys(r["task"] for r in fine):
        print(
            f"| {task} | "
            + " | ".join(f"{cell[task, b]:+.1f}" if (task, b) in cell else "-" for b in budgets)
            + " |"
        )
    medians = [statistics.median(v for (_, b2), v in cell.items() if b2 == b) for b in budgets]
    print("| median over the tasks run | " + " | ".join(f"{m:+.1f}" for m in medians) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="/tmp/bench-suite")
    parser.add_argument(
        "--budgets",
        type=budget_arg,
        nargs="+",
        default=[1, 2, 4],
        help="pretraining steps as multiples of 1800 (given as train.steps, they turn "
        "small.toml's time budget off), or a time budget such as 15m",
    )
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=None,
        help="task names (default: every task whose source is here)",
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument(
        "--recipe",
        nargs="+",
        default=[],
        metavar="NAME=VALUE",
        help="the recipe's optional steps, e.g. adapt_steps=300 probe_epochs=2",
    )
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args()
    args.recipe = parse_recipe(args.recipe)
    args.seq_len = 64  # prepare --seq-len 64, small.toml's max_sequence_length
    os.makedirs(args.out, exist_ok=True)
    if args.table_only:
        return table(args)
    import logging

    logging.basicConfig(level=logging.WARNING)
    if not os.path.isfile(os.path.join(args.out, "tasks.json")):
        print("tasks:", json.dumps(build(args)), flush=True)
    tasks = [t for t in json.load(open(os.path.join(args.out, "tasks.json"))) if t != "corpus"]
    if not os.path.isfile(os.path.join(args.out, "prepared", "manifest.json")):
        import kroberta

        kroberta.prepare(
            [os.path.join(args.out, "corpus.txt")],
            os.path.join(args.out, "prepared"),
            vocab_size=4096,
            seq_len=64,
            progress=False,
        )
    for budget in args.budgets:
        run_dir = pretrain(args, budget)
        print(f"pretrained {budget_name(budget)}: {common.last_validation(run_dir)}", flush=True)
        for task in tasks:
            if args.tasks is None or task in args.tasks:
                finetune_task(args, budget, run_dir, task)
    table(args)


if __name__ == "__main__":
    sys.exit(main())
