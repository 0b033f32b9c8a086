"""Checks on the run directory before any compute: writable, enough disk, clean history."""

import json
import os
import shutil

from kroberta.config import ConfigError
from kroberta.atomic import atomic_write


def check_writable(run_dir: str):
    """Fails clearly when the run directory cannot be created or written to."""
    try:
        os.makedirs(run_dir, exist_ok=True)
        probe = os.path.join(run_dir, f".write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as error:
        raise ConfigError(f"run_dir: cannot write to {run_dir}: {error.strerror}") from None


def check_free_space(run_dir: str, needed_bytes: int, what: str):
    free = shutil.disk_usage(run_dir).free
    if free < needed_bytes:
        raise ConfigError(
            f"run_dir: {run_dir} has {free / 2**20:.0f} MiB free but {what} needs about "
            f"{needed_bytes / 2**20:.0f} MiB; free some space or choose another --run_dir")


def truncate_metrics(run_dir: str, last_step: int):
    """Drops metrics.jsonl rows logged after `last_step` (by a run killed after its
    last checkpoint), so the resumed run's rows neither repeat nor leave gaps."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return 0
    kept, dropped = [], 0
    with open(path) as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                dropped += 1  # a line cut short by the kill
                continue
            if row.get("step", 0) <= last_step:
                kept.append(line if line.endswith("\n") else line + "\n")
            else:
                dropped += 1
    with atomic_write(path) as f:
        f.writelines(kept)
    return dropped
