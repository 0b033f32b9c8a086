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
    reason='libtpu is not installed (pip install "jax[tpu]==0.10.2" to compile for TPUs)',
)
TOPOLOGY = "v5e:2x2"
SMALL = [
    "model.vocabulary_size=256",
    "model.num_layers=2",
    "model.num_heads=4",
    "model.hidden_dim=128",
    "model.intermediate_dim=256",
    "model.max_sequence_length=256",
    "model.dropout=0.1",
    "train.batch_size_per_device=32",
    "train.mixed_precision=true",
    "train.steps_per_execution=1",
]


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
    found = memory_plan.options(config, devices, budget)
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
    config = config.with_section("train", batch_size_per_device=8)
    at_8 = memory_plan.measure(config, devices)
    at_24 = memory_plan.measure(config.with_section("train", batch_size_per_device=24), devices)
    budget = (at_8.total_bytes + at_24.total_bytes) / 2  # between 8 and 24 per device
    largest, measured, compiles = memory_plan.max_batch(config, devices, budget)
    assert 8 <= largest < 24 and largest % 8 == 0 and measured.fits(budget)
    bigger = config.with_section("train", batch_size_per_device=largest + 8)
    assert not memory_plan.measure(bigger, devices).fits(budget)
    assert compiles <= 7


def _device(needs, offered):
    """A stand-in for compiling: `needs(b)` bytes at batch b; XLA refuses beyond `offered`
    (naming it, as its out-of-memory errors do). Records the batches compiled."""
    from kroberta.perf.memory_plan import Measured

    compiled = []

    def at(b):
        compiled.append(b)
        if needs(b) > offered:
            return Measured(b, needs(b), None, refused=True, available=offered)
        return Measured(b, needs(b), 1.0)

    return at, compiled


GIB = 2**30
# bytes per device of base at 128 tokens on v2:2x2 (docs/benchmarks/base-memory.md), joined
# by straight lines: flat stretches and a jump, as XLA's buffer assignment gives.
V2_BASE_128 = [
    (1, 2.3),
    (32, 3.08),
    (64, 3.77),
    (256, 6.84),
    (272, 6.83),
    (296, 6.90),
    (328, 6.93),
    (344, 7.26),
    (352, 7.33),
    (360, 7.53),
    (368, 8.01),
    (4096, 90.0),
]


def _joined(points):
    def needs(b):
        for (b0, g0), (b1, g1) in zip(points, points[1:]):
            if b0 <= b <= b1:
                return (g0 + (g1 - g0) * (b - b0) / (b1 - b0)) * GIB
        raise AssertionError(b)

    return needs


# most_whole: the compiles that run whole (the device holds the program; a refusal stops in
# seconds), past the first
@pytest.mark.parametrize(
    "needs, offered, budget, most_compiles, most_whole",
    [
        (lambda b: 2 * GIB + b * 2**24, 7.48 * GIB, 8 * GIB, 5, 1),  # affine
        (lambda b: 2.3 * GIB + 0.06 * GIB * b**0.85, 7.48 * GIB, 8 * GIB, 6, 2),  # below a line
        (_joined(V2_BASE_128), 7.48 * GIB, 8 * GIB, 6, 2),
        (
            lambda b: 3.09 * GIB if b == 32 else 1.6 * GIB + b * 0.0095 * GIB,
            7.48 * GIB,
            8 * GIB,
            6,
            2,
        ),
        (lambda b: 2 * GIB + b * 2**24, 15.7 * GIB, 6 * GIB, 5, 3),  # the budget below the device
        (lambda b: 7 * GIB + b * 0.1 * GIB, 7.48 * GIB, 8 * GIB, 7, 2),  # only a few sequences
        (lambda b: 9 * GIB + b, 7.48 * GIB, 8 * GIB, 8, 0),  # not even one
    ],
    ids=["affine", "concave", "v2-base-128", "non-monotone", "budget", "few", "none"],
)
def test_the_search_finds_the_largest_fitting_batch_in_few_compiles(
    needs, offered, budget, most_compiles, most_whole
):
    from kroberta.perf.memory_plan import largest_fitting

    at, compiled = _device(needs, offered)
    largest, measured, compiles = largest_fitting(at, 32, budget)
    every = [
        b for b in range(1, 2000) if (b < 8 or b % 8 == 0) and needs(b) <= min(offered, budget)
    ]
    assert largest == max(every, default=0)
    assert compiles == len(compiled) == len(set(compiled)) <= most_compiles, compiled
    assert sum(needs(b) <= offered for b in compiled[1:]) <= most_whole, compiled
    if largest:
        assert measured.batch_size_per_device == largest and measured.fits(budget)
    else:
        assert measured is None
