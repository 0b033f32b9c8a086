"""Learning-rate schedules (kroberta.model.schedules): exact values at chosen steps, the
config key that picks one, and the rate logged every interval."""

import dataclasses
import math

import keras
import numpy as np
import pytest

from kroberta.config import TrainConfig, validate
from kroberta.errors import ConfigError
from kroberta.model import schedules
from kroberta.model.mlm import build_optimizer
from tests.conftest import tiny_config

# The fast tier (docs/contributing.md): builds no model and starts no process.
pytestmark = pytest.mark.fast

# peak 2, warmup 10, total 110: the decay spans steps 10..110.
WARMUP = {0: 0.0, 1: 0.2, 5: 1.0, 10: 2.0}
AFTER = {
    "linear": {35: 1.5, 60: 1.0, 110: 0.0, 300: 0.0},
    "cosine": {
        35: 1 + math.cos(math.pi / 4),
        60: 1.0,
        85: 1 - math.cos(math.pi / 4),
        110: 0.0,
        300: 0.0,
    },
    "constant": {35: 2.0, 110: 2.0, 300: 2.0},
    "inverse_sqrt": {40: 1.0, 90: 2 / 3, 250: 0.4, 1000: 0.2},
    # decay_steps 40: stable at the peak until step 70, then linear to 0 at 110.
    "wsd": {35: 2.0, 70: 2.0, 80: 1.5, 100: 0.5, 110: 0.0, 300: 0.0},
}
# The same schedules with a floor of 0.4: linear, cosine and wsd end there, inverse_sqrt
# is cut there, constant never decays.
FLOORED = {
    "linear": {35: 0.4 + 1.6 * 0.75, 60: 1.2, 110: 0.4, 300: 0.4},
    "cosine": {60: 1.2, 85: 0.4 + 0.8 * (1 - math.cos(math.pi / 4)), 110: 0.4, 300: 0.4},
    "constant": {35: 2.0, 300: 2.0},
    "inverse_sqrt": {40: 1.0, 250: 0.4, 1000: 0.4, 10_000: 0.4},
    "wsd": {70: 2.0, 90: 1.2, 110: 0.4, 300: 0.4},
}


def _values(schedule, steps):
    return {step: float(np.asarray(schedule(step))) for step in steps}


@pytest.mark.parametrize("decay", schedules.SCHEDULES)
def test_schedule_values_at_chosen_steps(decay):
    schedule = schedules.WarmupSchedule(2.0, 10, 110, decay, decay_steps=40)
    expected = {**WARMUP, **AFTER[decay]}
    got = {step: float(np.asarray(schedule(step))) for step in expected}
    assert got == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("decay", schedules.SCHEDULES)
def test_min_learning_rate_is_every_decaying_schedules_floor(decay):
    schedule = schedules.WarmupSchedule(2.0, 10, 110, decay, min_learning_rate=0.4, decay_steps=40)
    expected = {**WARMUP, **FLOORED[decay]}  # the warmup still rises from 0
    assert _values(schedule, expected) == pytest.approx(expected, abs=1e-6)


def test_wsd_decay_spans_decay_steps_or_a_fraction_of_the_run(tiny_data, tmp_path):
    by_fraction = tiny_config(
        tiny_data,
        tmp_path,
        schedule="wsd",
        steps=200,
        warmup_steps=10,
        learning_rate=1.0,
        decay_fraction=0.25,
    )
    rate = build_optimizer(validate(by_fraction).train)._learning_rate
    assert _values(rate, [150, 175, 200]) == pytest.approx({150: 1.0, 175: 0.5, 200: 0.0})
    by_steps = dataclasses.replace(
        by_fraction,
        train=dataclasses.replace(by_fraction.train, decay_steps=20, min_learning_rate=0.2),
    )
    rate = build_optimizer(validate(by_steps).train)._learning_rate
    assert _values(rate, [180, 190, 200]) == pytest.approx({180: 1.0, 190: 0.6, 200: 0.2})


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("min_learning_rate", 5.0, r"train.min_learning_rate: must be in \[0, train.learning_rate"),
        (
            "decay_steps",
            500,
            r"train.decay_steps: must be in \[0, train.steps - train.warmup_steps",
        ),
        ("decay_fraction", 0.0, r"train.decay_fraction: must be in \(0, 1\]"),
    ],
)
def test_impossible_floor_or_decay_is_a_config_error(tiny_data, tmp_path, key, value, message):
    with pytest.raises(ConfigError, match=message):
        validate(tiny_config(tiny_data, tmp_path, **{key: value}))


@pytest.mark.parametrize("decay", schedules.SCHEDULES)
def test_a_warmup_fraction_builds_the_schedule_of_the_equal_warmup_steps(decay):
    train = TrainConfig(steps=1800, learning_rate=2e-3, schedule=decay, min_learning_rate=1e-4)
    by_fraction = dataclasses.replace(train, warmup_steps=0, warmup_fraction=0.5)
    by_steps = dataclasses.replace(train, warmup_steps=900, warmup_fraction=0.0)
    every_step = np.arange(0, 2001)
    fraction_rates = np.asarray(schedules.from_train_config(by_fraction)(every_step))
    steps_rates = np.asarray(schedules.from_train_config(by_steps)(every_step))
    assert fraction_rates.shape == (2001,)
    np.testing.assert_array_equal(fraction_rates, steps_rates)
    assert fraction_rates[900] == pytest.approx(2e-3) and fraction_rates[450] == pytest.approx(1e-3)


def test_without_warmup_every_schedule_starts_at_the_peak():
    for decay in schedules.SCHEDULES:
        assert float(np.asarray(schedules.WarmupSchedule(3.0, 0, 100, decay)(0))) == 3.0


def test_a_scale_multiplies_the_rate_and_changes_without_a_new_schedule():
    """Fine-tuning's schedule: peak 1 times a variable holding the peak, bit for bit the
    product of the two (the rate a fine-tune's earlier schedule class computed)."""
    schedule = schedules.WarmupSchedule(1.0, 6, 100)
    shape = _values(schedule, range(0, 120, 7))
    schedule.scale = keras.Variable(3e-5, dtype="float32")
    for peak in (3e-5, 1e-3):
        schedule.scale.assign(peak)
        assert _values(schedule, shape) == {
            s: float(np.float32(peak) * np.float32(v)) for s, v in shape.items()
        }


def test_schedule_config_round_trips():
    schedule = schedules.WarmupSchedule(1e-3, 5, 50, "wsd", min_learning_rate=1e-4, decay_steps=20)
    again = schedules.WarmupSchedule.from_config(schedule.get_config())
    for step in (0, 3, 20, 50):
        assert float(np.asarray(again(step))) == float(np.asarray(schedule(step)))


def test_train_schedule_picks_the_optimizer_schedule(tiny_data, tmp_path):
    config = tiny_config(
        tiny_data, tmp_path, schedule="inverse_sqrt", warmup_steps=4, learning_rate=1e-2
    )
    rate = build_optimizer(validate(config).train)._learning_rate  # the schedule, not its value
    assert isinstance(rate, schedules.WarmupSchedule) and rate.decay == "inverse_sqrt"
    assert float(np.asarray(rate(16))) == pytest.approx(5e-3)


def test_unknown_schedule_is_a_config_error(tiny_data, tmp_path):
    with pytest.raises(ConfigError, match=r"train.schedule: must be one of .*'cosine'.*got 'cos'"):
        validate(tiny_config(tiny_data, tmp_path, schedule="cos"))
