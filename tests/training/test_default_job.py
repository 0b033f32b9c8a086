"""The embedded default job (`python -m kroberta.train` with no arguments): its recipe,
run briefly on its own corpus (the standard library's docstrings), learns."""

import dataclasses
import json
import math
import os

from kroberta import train
from kroberta.config import Config


def test_default_recipe_falls_well_below_chance_in_a_short_run(tmp_path):
    # Every default (model, data, masking, learning rate, batch, schedule shape: the warmup is
    # a fraction of the run, so it shortens with it); only the run's length and its intervals
    # are shortened.
    default = Config()
    steps = 120
    t = dataclasses.replace(
        default.train, steps=steps, log_every=20, eval_every=0, checkpoint_every=steps
    )
    # One device, as `python -m kroberta.train` sees a CPU (the tests simulate four).
    one = dataclasses.replace(default.distributed, devices=1)
    summary = train(
        dataclasses.replace(default, train=t, distributed=one, run_dir=str(tmp_path / "run"))
    )
    assert summary["final_step"] == steps
    with open(os.path.join(tmp_path, "run", "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    chance = math.log(default.model.vocabulary_size)
    first = next(r for r in rows if r["split"] == "train")
    last = [r for r in rows if r["split"] == "validation"][-1]
    assert first["loss"] > chance - 1.0  # it starts near chance...
    assert last["loss"] < chance - 1.0  # ...and ends well below it on held-out text
