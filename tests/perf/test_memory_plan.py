"""Planning memory by compiling (kroberta.perf.memory_plan): the advisor's cheapest change
for a training step that does not fit does fit when applied, and `max_batch` finds the
edge; compiled ahead of time for a TPU topology with a small model and a forced-small
memory budget (needs libtpu). Both are slow (several AOT compiles each); the CLI's
default-suite coverage is tests/perf/test_aot.py."""

import importlib.util

import pytest

from kroberta.config import Config, apply_overrides, validate

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason='libtpu is not installed (pip install "jax[tpu]==0.10.2" to compile for TPUs)')
TOPOLOGY = "v5e:2x2"
SMALL = ["model.vocabulary_size=256", "model.num_layers=2", "model.num_heads=4",
         "model.hidden_dim=128", "model.intermediate_dim=256", "model.max_sequence_length=256",
         "model.dropout=0.1", "train.batch_size_per_device=32", "train.mixed_precision=true",
         "train.steps_per_execution=1"]


@pytest.fixture(scope="module")
def small():
    from kroberta.perf import tpu_compile

    config = apply_overrides(Config(), SMALL)
    return validate(config), tpu_compile.topology_devices(TOPOLOGY)


@needs_libtpu
@pytest.mark.slow  # six compiles for a TPU (~20 s each on a quiet 2-core machine)
def test_the_cheapest_change_that_fits_fits_when_applied(small):
    from kroberta.perf import memory_plan

    config, devices = small
    needed = memory_plan.measure(config, devices)
    budget = 0.95 * needed.total_bytes  # a device just too small for it
    assert not needed.fits(budget)
    found = memory_plan.options(config, devices, budget, log=print)
    best = found[-1]
    assert best.measured.fits(budget), [(o.describe, o.measured) for o in found]
    assert all(not o.measured.fits(budget) for o in found[:-1])  # cheaper ones were tried
    applied = apply_overrides(config, [o[2:] for o in best.describe.split()])
    assert applied != config
    assert memory_plan.measure(applied, devices).fits(budget)


@needs_libtpu
@pytest.mark.slow
def test_max_batch_is_the_edge(small):
    from kroberta.perf import memory_plan

    config, devices = small
    config = memory_plan.with_train(config, batch_size_per_device=8)
    at_8 = memory_plan.measure(config, devices)
    at_24 = memory_plan.measure(memory_plan.with_train(config, batch_size_per_device=24), devices)
    budget = (at_8.total_bytes + at_24.total_bytes) / 2  # between 8 and 24 per device
    largest, measured, compiles = memory_plan.max_batch(config, devices, budget)
    assert 8 <= largest < 24 and largest % 8 == 0 and measured.fits(budget)
    bigger = memory_plan.with_train(config, batch_size_per_device=largest + 8)
    assert not memory_plan.measure(bigger, devices).fits(budget)
    assert compiles <= 7
