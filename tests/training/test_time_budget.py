"""train.time_budget: the steps measured once, recorded, and resumed from the record."""

import dataclasses
import re
import types

import numpy as np
import pytest

from kroberta import train
from kroberta.config import load_config, load_toml
from kroberta.errors import ConfigError
from kroberta.parallel import distribute  # noqa: F401 (its import is no step's time)
from kroberta.training import time_budget
from kroberta.training.time_budget import Measurement, steps_within
from tests.conftest import tiny_config
from tests.pretraining.test_train import _rows, _weights


def _budget_config(tiny_data, run_dir, budget, **train):
    # A Config built in Python: the budget replaces its steps (tiny's 200 included).
    return tiny_config(tiny_data, run_dir, time_budget=budget, **train)


@pytest.mark.fast
def test_the_steps_that_fit_count_compilation_evaluations_and_whole_dispatches():
    measured = Measurement(
        step_seconds=0.5,
        first_step=11,
        last_step=30,
        build_seconds=2.0,
        compile_seconds=10.0,
        eval_seconds=4.0,
        eval_compile_seconds=3.0,
        start_seconds=1.0,
    )
    # 100 s left - 2 - 10 - 1 - 3 - 4 (the final evaluation) = 80 s; a step 0.5 + 4 / 40 =
    # 0.6 s: 133 steps, 130 in whole dispatches of 10.
    assert steps_within(120.0, 20.0, measured, eval_every=40, steps_per_dispatch=10) == 130
    # No evaluation between: 80 / 0.5 = 160, in dispatches of 1.
    assert steps_within(120.0, 20.0, measured, eval_every=0, steps_per_dispatch=1) == 160
    # Start-up took the whole budget: no step fits.
    assert steps_within(30.0, 20.0, measured, eval_every=40, steps_per_dispatch=1) == 0


def test_a_budget_run_ends_its_schedule_at_the_steps_it_recorded(
    tiny_data, tmp_path, caplog, monkeypatch
):
    # Start-up and compilation take 30-90 s on a loaded 2-core machine: the test's budget
    # of 10 s is what is left after them (the measured step and evaluation times count).
    measure_from_now = lambda budget, elapsed, measured, *rest: steps_within(  # noqa: E731
        budget,
        0.0,
        dataclasses.replace(
            measured,
            build_seconds=0.0,
            compile_seconds=0.0,
            eval_compile_seconds=0.0,
            start_seconds=0.0,
        ),
        *rest,
    )
    monkeypatch.setattr(time_budget, "steps_within", measure_from_now)
    run_dir = tmp_path / "run"
    summary = train(_budget_config(tiny_data, run_dir, "10s", eval_every=0))
    line = next(m for m in caplog.messages if m.startswith("time budget 10s: "))
    assert re.fullmatch(
        r"time budget 10s: [\d,]+ steps at [\d.e-]+ s/step measured over steps "
        r"6-25 \(start-up, measurement and compilation \d+ s, in place of "
        r"train.steps=200\)",
        line,
    ), line
    recorded = load_toml(str(run_dir / "config.toml")).train
    assert recorded.time_budget == "10s" and recorded.steps % 5 == 0  # whole dispatches
    assert summary["steps"] == summary["final_step"] == recorded.steps
    assert f"{recorded.steps:,} steps" in line
    rows = _rows(run_dir)
    assert rows[-1]["step"] == recorded.steps
    assert rows[-1]["learning_rate"] == 0.0  # the linear decay ends at the last step
    assert max(r["learning_rate"] for r in rows) == pytest.approx(3e-3)


def test_a_resumed_budget_run_uses_its_recorded_steps_and_equals_a_run_of_those_steps(
    tiny_data, tmp_path, monkeypatch, caplog
):
    # The measured steps: a fixed number, so that the run can stop part-way.
    kwargs = dict(eval_every=0, checkpoint_every=10)
    monkeypatch.setattr(time_budget, "steps_within", lambda *args: 0)
    with pytest.raises(
        ConfigError,
        match=r"^train.time_budget='1m': no training step fits: "
        r"start-up, the measurement and the compilation take \d+ s and 5 step\(s\) "
        r"[\d.]+ s; give a longer budget$",
    ):
        train(_budget_config(tiny_data, tmp_path / "none", "1m", **kwargs))
    assert not (tmp_path / "none").exists()  # nothing half-made is left
    monkeypatch.setattr(time_budget, "steps_within", lambda *args: 30)
    resumed = tmp_path / "resumed"
    first = train(_budget_config(tiny_data, resumed, "1m", **kwargs), until_step=10)
    assert first["final_step"] == 10 and first["steps"] == 30
    assert load_toml(str(resumed / "config.toml")).train.steps == 30
    caplog.clear()
    monkeypatch.setattr(time_budget, "steps_within", lambda *args: pytest.fail("measured again"))
    second = train(_budget_config(tiny_data, resumed, "1m", **kwargs))
    assert second["start_step"] == 10 and second["final_step"] == second["steps"] == 30
    assert (
        "time budget 1m: 30 steps, fixed when the run started (its config.toml)" in caplog.messages
    )
    straight = tmp_path / "straight"
    train(tiny_config(tiny_data, straight, steps=30, **kwargs))
    a, b = _weights(straight), _weights(resumed)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])  # bitwise on CPU
    # The same run directory with another budget: its steps were fixed by the first one.
    with pytest.raises(
        ConfigError,
        match=re.escape(
            f"train.time_budget: {resumed} holds a run of 30 steps fixed by the budget '1m', "
            "not by '2m'; a budget fixes the steps once"
        ),
    ):
        train(_budget_config(tiny_data, resumed, "2m", **kwargs))


@dataclasses.dataclass(frozen=True)
class _RunData:  # what fix_steps reads of a RunData before it measures
    config: object


@pytest.mark.fast
def test_the_fixed_steps_are_logged_and_too_few_for_the_warmup_are_refused(monkeypatch, caplog):
    measured = Measurement(
        step_seconds=0.5, first_step=6, last_step=25, build_seconds=1.0, compile_seconds=4.0
    )
    monkeypatch.setattr(time_budget, "measure", lambda plan, run_data: measured)
    # The clock stands still: 10 s have passed since the call of `train`, whatever the load.
    monkeypatch.setattr(time_budget, "time", types.SimpleNamespace(perf_counter=lambda: 1000.0))
    config = load_config(
        "tiny", {"train.time_budget": "1m", "train.steps_per_execution": 5, "train.eval_every": 0}
    )
    plan = types.SimpleNamespace(config=config)
    run_data = _RunData(config)
    # 60 s - 10 s so far - 1 - 4 = 45 s: 90 steps of 0.5 s, 18 whole dispatches of 5.
    with caplog.at_level("INFO", logger="kroberta"):
        fixed = time_budget.fix_steps(config, run_data, plan, 990.0)
    assert fixed.train.steps == 90
    assert fixed.train.time_budget == "1m" and fixed.train.warmup_steps == 20
    assert re.fullmatch(
        r"time budget 1m: 90 steps at 0.5 s/step measured over steps 6-25 "
        r"\(start-up, measurement and compilation 15 s, in place of "
        r"train.steps=200\)",
        caplog.messages[-1],
    ), caplog.messages[-1]
    # 22 s: 7 s left, 14 steps, 10 in whole dispatches of 5, fewer than tiny's 20 warmup steps.
    config = dataclasses.replace(config, train=dataclasses.replace(config.train, time_budget="22s"))
    with pytest.raises(
        ConfigError,
        match=r"^train.time_budget='22s' fits \d+ steps; .*train."
        r"warmup_steps: 20 exceeds train.steps=10.*; give a longer budget$",
    ):
        time_budget.fix_steps(config, run_data, types.SimpleNamespace(config=config), 990.0)
