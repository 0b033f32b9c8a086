"""A run's curves in one picture: `kroberta.report(run_dir)`, `python -m kroberta.report runs/x`.

Reads `runs/x/metrics.jsonl` (written by training: one train row per log interval,
one validation row per evaluation), draws loss, masked accuracy, learning rate,
tokens/s, MFU and (when the step logs it) the gradient norm into `runs/x/report.png`
and logs a short summary (the `kroberta` logger), which names the best checkpoint (the kept checkpoint with
the lowest validation loss, `kroberta.load(run_dir, checkpoint="best")`).

With `train.downstream`, a panel shows the probe's main metric per checkpoint beside the
same probe on a random initialisation of the run's shape with the band of its noise, and
the summary gives the verdict: the first checkpoint whose probe beats the random
initialisation's by more than the noise ("pretraining pays from step N": the 95%
bootstrap interval over the validation texts of the difference is above 0), or "not
yet beyond the noise" with the best checkpoint's difference and interval.
"""

import logging
import math
import statistics

from kroberta import console, storage
from kroberta.errors import InputError
from kroberta.run_layout import CONFIG_FILE, WEIGHTS_FILE, load_run_config
from kroberta.runtime import logs
from kroberta.training import signals
from kroberta.training.run_dir import (
    METRICS_FILE,
    PROBE_GAP,
    PROBE_PREFIX,
    RANDOM_INIT,
    is_probe_reference,
    metrics_rows,
)

REPORT_FILE = "report.png"
PANELS = (
    ("loss", "loss (masked tokens)"),
    ("masked_accuracy", "masked accuracy"),
    ("learning_rate", "learning rate"),
    ("tokens_per_second", "tokens / s"),
    ("mfu", "MFU (model FLOPs utilisation)"),
)
GRAD_NORM_PANEL = ("grad_norm", "gradient norm (before clipping)")  # drawn when logged

logger = logging.getLogger(__name__)


def read_metrics(run_dir: str) -> list[dict]:
    path = storage.join(run_dir, METRICS_FILE)
    if not storage.isfile(path):
        what = "no such directory" if not storage.isdir(run_dir) else f"no {METRICS_FILE} in it"
        raise InputError(
            f"{run_dir}: {what}; train a run there first (python -m kroberta.train --run_dir=...)"
        )
    # A run killed mid-write leaves a partial last line: skipped, and said so.
    rows = metrics_rows(run_dir, warn=True)
    if not rows:
        raise InputError(f"{path}: holds no rows yet")
    return rows


def _series(rows, split, key):
    points = [
        (r["step"], r[key])
        for r in rows
        if r.get("split") == split
        and isinstance(r.get(key), (int, float))
        and math.isfinite(r[key])
    ]
    return [p[0] for p in points], [p[1] for p in points]


def _main_metric(row: dict):
    """A probe row's main metric (the task's first) and its value, or (None, None)."""
    for key, value in row.items():
        if key not in ("step", "split", "seconds") and isinstance(value, (int, float)):
            return key, value
    return None, None


def probe_verdicts(rows: list[dict]) -> dict:
    """Per probed split ("downstream/<task>[/<split>]"), the probe against its random
    initialisation: {split: {"metric", "points" [(step, value)], "random_init" (None when
    not logged), "gaps" {step: (difference, low, high)} (the main metric minus the random
    initialisation's on the same texts, with its 95% bootstrap interval, where the row has
    it), "pays_from_step" (the first step whose interval is above 0: beyond the noise of
    which texts were drawn; or None), "best", "best_step"}}."""
    verdicts = {}
    for row in rows:
        split = row.get("split", "")
        if not split.startswith(PROBE_PREFIX):
            continue
        metric, value = _main_metric(row)
        if metric is None or not math.isfinite(value):
            continue
        reference = is_probe_reference(split)
        name = split[: -len(RANDOM_INIT) - 1] if reference else split
        entry = verdicts.setdefault(
            name, {"metric": metric, "points": [], "random_init": None, "gaps": {}}
        )
        if reference:
            entry["random_init"] = value
            continue
        entry["points"].append((row["step"], value))
        gap = tuple(row.get(f"{PROBE_GAP}{end}") for end in ("", "_low", "_high"))
        if all(isinstance(v, (int, float)) and math.isfinite(v) for v in gap):
            entry["gaps"][row["step"]] = gap
    for entry in verdicts.values():
        entry["pays_from_step"] = next(
            (
                step
                for step, _ in entry["points"]
                if step in entry["gaps"] and entry["gaps"][step][1] > 0
            ),
            None,
        )
        if entry["points"]:
            entry["best_step"], entry["best"] = max(entry["points"], key=lambda p: p[1])
    return verdicts


def summarize(rows: list[dict]) -> dict:
    train = [r for r in rows if r.get("split") == "train"]
    validation = [r for r in rows if r.get("split") == "validation" and "loss" in r]
    out = {"steps": max((r["step"] for r in rows), default=0)}
    if train:
        out["final_train_loss"] = train[-1].get("loss")
    if validation:
        best = min(validation, key=lambda r: r["loss"])
        out.update(
            final_validation_loss=validation[-1]["loss"],
            final_validation_accuracy=validation[-1].get("masked_accuracy"),
            best_validation_loss=best["loss"],
            best_validation_step=best["step"],
            best_validation_accuracy=max(r.get("masked_accuracy", 0.0) for r in validation),
        )
    for key in ("tokens_per_second", "samples_per_second", "mfu", "step_time"):
        values = [r[key] for r in train if isinstance(r.get(key), (int, float))]
        if values:
            out[f"median_{key}"] = statistics.median(values)
    compile_times = [r["compile_seconds"] for r in train if "compile_seconds" in r]
    if compile_times:
        out["compile_seconds"] = sum(compile_times)  # one per (re)start of the run
    norms = [r["grad_norm"] for r in train if isinstance(r.get("grad_norm"), (int, float))]
    if norms:
        out.update(
            final_grad_norm=norms[-1],
            median_grad_norm=statistics.median(norms),
            max_grad_norm=max(norms),
        )
    probes = probe_verdicts(rows)
    if probes:
        out["probe"] = probes
    return out


def draw(rows: list[dict], path: str, title: str = "", best_step: int | None = None):
    """Draws the panels into the PNG `path`; returns the matplotlib Figure.

    `best_step`: the best checkpoint's step, marked on the loss panel.
    """
    # A bare Figure, not pyplot: no backend is switched (a notebook's inline plots keep
    # working) and nothing is left open in pyplot's figure list.
    from matplotlib.figure import Figure

    logged = any("grad_norm" in r for r in rows if r.get("split") == "train")
    panels = PANELS + ((GRAD_NORM_PANEL,) if logged else ())
    probes = probe_verdicts(rows)
    fig = Figure(figsize=(8, 2.3 * (len(panels) + bool(probes))))
    axes = fig.subplots(len(panels) + bool(probes), 1, sharex=True)
    if probes:
        _draw_probes(axes[-1], probes)
    for ax, (key, label) in zip(axes, panels):
        for split, style in (("train", "-"), ("validation", "o-")):
            steps, values = _series(rows, split, key)
            if steps:
                ax.plot(steps, values, style, label=split, markersize=4)
        if key == "loss" and best_step is not None:
            ax.axvline(
                best_step,
                color="green",
                alpha=0.5,
                linestyle="--",
                label=f"best checkpoint (step {best_step})",
            )
        ax.set_ylabel(label, fontsize=8)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7, loc="best")
        else:
            ax.text(
                0.5,
                0.5,
                "not logged",
                ha="center",
                va="center",
                transform=ax.transAxes,
                color="grey",
            )
    axes[-1].set_xlabel("step")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return fig


def _draw_probes(ax, probes: dict):
    """The probe per checkpoint, its random initialisation as a dashed line and around it
    the band of the noise: a checkpoint above the band's top is beyond the noise (its
    interval of the difference clears 0)."""
    for split, entry in probes.items():
        task = split[len(PROBE_PREFIX) :]
        if entry["points"]:
            steps, values = zip(*entry["points"])
            (line,) = ax.plot(steps, values, "o-", markersize=4, label=f"{task}: pretrained")
            color = line.get_color()
        else:
            color = None
        reference = entry["random_init"]
        if reference is None:
            continue
        ax.axhline(
            reference,
            color=color,
            linestyle="--",
            alpha=0.7,
            label=f"{task}: random initialisation",
        )
        if entry["gaps"]:
            # At each checkpoint the band spans the difference's interval moved to 0:
            # (difference - high, difference - low) around the line.
            steps = sorted(entry["gaps"])
            below = [reference - (entry["gaps"][s][2] - entry["gaps"][s][0]) for s in steps]
            above = [reference + (entry["gaps"][s][0] - entry["gaps"][s][1]) for s in steps]
            if len(steps) == 1:  # a band needs two ends: the one checkpoint's, as wide as a bar
                steps, below, above = [steps[0] * 0.95, steps[0] * 1.05], below * 2, above * 2
            ax.fill_between(
                steps,
                below,
                above,
                color=color,
                alpha=0.15,
                label=f"{task}: noise (95% bootstrap over the texts)",
            )
    metrics = sorted({entry["metric"] for entry in probes.values()})
    ax.set_ylabel(f"probe {' / '.join(metrics)}", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")


def _measured(entry: dict, step: int) -> str:
    """A probe's score at `step` against the random initialisation's, with its interval."""
    gap = entry["gaps"].get(step)
    interval = f"{gap[0]:+.4g} [{gap[1]:+.4g}, {gap[2]:+.4g}]" if gap else "no interval logged"
    return f"{entry['metric']} {dict(entry['points'])[step]:.4g} vs {entry['random_init']:.4g}, {interval}"


def verdict_lines(probes: dict) -> list[str]:
    """The summary's line per probed split: where pretraining beats a random start by more
    than the noise of the texts it is scored on."""
    lines = []
    for split, entry in probes.items():
        task, reference = split[len(PROBE_PREFIX) :], entry["random_init"]
        if reference is None or not entry["points"]:
            continue  # a run from before the reference was logged, or no checkpoint yet
        if entry["pays_from_step"] is not None:
            step = entry["pays_from_step"]
            lines.append(
                f"probe {task}: pretraining pays from step {step} ({_measured(entry, step)}: "
                "beyond the noise of a 95% bootstrap over the validation texts; best "
                f"{entry['best']:.4g} at step {entry['best_step']})"
            )
        else:
            lines.append(
                f"probe {task}: not yet beyond the noise (best: step "
                f"{entry['best_step']}, {_measured(entry, entry['best_step'])}; a 95% bootstrap "
                "over the validation texts)"
            )
    return lines


def _format(summary: dict) -> list[str]:
    def g(key, fmt="{:.4g}"):
        value = summary.get(key)
        return fmt.format(value) if isinstance(value, (int, float)) else "-"

    planned = summary.get("planned_steps")
    short = (
        f" of {planned} ({'stopped early' if summary.get('finished') else 'unfinished'})"
        if planned and summary["steps"] < planned
        else ""
    )
    lines = [f"steps: {summary['steps']}{short}   final train loss: {g('final_train_loss')}"]
    if "final_validation_loss" in summary:
        lines.append(
            f"validation: final loss {g('final_validation_loss')}, accuracy "
            f"{g('final_validation_accuracy')}; best loss {g('best_validation_loss')} "
            f"(step {summary['best_validation_step']}), best accuracy "
            f"{g('best_validation_accuracy')}"
        )
    if "best_checkpoint_step" in summary:
        lines.append(
            f"best checkpoint: step {summary['best_checkpoint_step']} (validation loss "
            f"{g('best_checkpoint_loss')}), {summary['best_checkpoint']}: "
            'kroberta.load(run_dir, checkpoint="best")'
        )
    lines += verdict_lines(summary.get("probe", {}))
    if "final_grad_norm" in summary:
        lines.append(
            f"grad_norm: final {g('final_grad_norm')}, median "
            f"{g('median_grad_norm')}, max {g('max_grad_norm')}"
        )
    lines.append(
        f"median: {g('median_tokens_per_second', '{:,.0f}')} tokens/s, "
        f"{g('median_samples_per_second', '{:.1f}')} samples/s, step "
        f"{g('median_step_time', '{:.4f}')} s, MFU "
        + (f"{100 * summary['median_mfu']:.1f}%" if "median_mfu" in summary else "-")
        + f"; compile {g('compile_seconds', '{:.1f}')} s"
    )
    return lines


def report(run_dir: str, show: bool | None = None) -> dict:
    """Draws `run_dir/report.png` and logs the summary; returns the summary dict.

    Args:
        run_dir: a run directory (holds metrics.jsonl).
        show: display the picture inline; None = when running in a Jupyter notebook.

    Returns:
        The summary (steps, the config's `planned_steps` and whether the run `finished`,
        final and best losses, median throughput and MFU, compile time, grad_norm when
        logged, the best kept checkpoint, `probe`: `probe_verdicts` with train.downstream), with `report_png` (the picture's path) and
        `figure` (the matplotlib Figure, for further use) added.
    """
    run_dir = storage.directory_argument(run_dir, "kroberta.report", "run directory")
    logs.show_messages()
    rows = read_metrics(run_dir)
    summary = summarize(rows)
    if storage.isfile(storage.join(run_dir, CONFIG_FILE)):
        summary["planned_steps"] = load_run_config(run_dir).train.steps
        # The final model is written when a run ends, early stopping included.
        summary["finished"] = storage.isfile(storage.join(run_dir, WEIGHTS_FILE))
    best = signals.best_checkpoint(run_dir)
    if best is not None:
        summary.update(
            best_checkpoint_step=best[0], best_checkpoint=best[1], best_checkpoint_loss=best[2]
        )
    path = storage.join(run_dir, REPORT_FILE)
    with storage.staged_file(path) as local:  # matplotlib writes a local file; a URL gets a copy
        figure = draw(
            rows,
            local,
            title=storage.basename(storage.absolute(run_dir)),
            best_step=best[0] if best else None,
        )
    for line in _format(summary) + [f"curves: {path}"]:
        logger.info(line)
    if console.in_jupyter() if show is None else show:
        # IPython: there in a notebook only
        from IPython.display import Image, display

        display(Image(data=storage.read_bytes(path)))
    summary["report_png"] = path
    summary["figure"] = figure
    return summary
