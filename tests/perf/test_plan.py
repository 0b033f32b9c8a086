"""The plan: batches, steps per dispatch, slots and masking resolved once (no model built)."""

import dataclasses

import jax
import pytest

from kroberta.config import AUTO, config_path, load_toml
from kroberta.errors import ConfigError
from kroberta.parallel import distribute
from kroberta.perf import dispatch_size, flops, hardware, throughput
from kroberta.perf.plan import make_plan

pytestmark = pytest.mark.fast


@dataclasses.dataclass(frozen=True)
class FakeDevice:
    """What the plan reads of a `jax.Device` (a TPU topology's devices, two hosts)."""

    id: int
    process_index: int
    platform: str = "tpu"
    device_kind: str = "TPU v4"


def _config(**sections):
    config = load_toml(config_path("tiny"))
    changes = {
        name: dataclasses.replace(getattr(config, name), **fields)
        for name, fields in sections.items()
    }
    return dataclasses.replace(config, **changes)


def _two_hosts(count=8):
    """`count` TPU devices, the first half on process 0, the rest on process 1."""
    return tuple(FakeDevice(i, i * 2 // count) for i in range(count))


def test_batches_are_per_device_times_devices_times_accumulation():
    config = _config(
        train={
            "batch_size_per_device": 3,
            "gradient_accumulation_steps": 2,
            "steps_per_execution": 5,
        }
    )
    plan = make_plan(config)  # the 4 simulated CPU devices, one process
    assert (plan.micro_batch, plan.global_batch, plan.process_batch) == (12, 24, 24)
    assert plan.topology.num_devices == 4 and plan.topology.mesh_shape == {"batch": 4}
    assert plan.data_shard is None and plan.steps_per_dispatch == 5 and not plan.auto_steps
    assert plan.config == config  # nothing to resolve
    two = make_plan(_config(train={"batch_size_per_device": 3}, distributed={"devices": 2}))
    assert (two.micro_batch, two.global_batch, two.topology.num_devices) == (6, 6, 2)


def test_a_process_reads_its_share_of_a_two_process_topology():
    config = _config(
        train={
            "batch_size_per_device": 2,
            "gradient_accumulation_steps": 3,
            "steps_per_execution": 1,
        }
    )
    for index in (0, 1):
        topology = distribute.topology_for(
            config.distributed, config.model, _two_hosts(), processes=(2, index)
        )
        plan = make_plan(config, topology=topology)
        assert (plan.micro_batch, plan.global_batch) == (16, 48)
        assert plan.process_batch == 24 == plan.global_batch // 2
        assert plan.data_shard == (2, index) and topology.local_device_count == 4


def test_the_mesh_has_a_model_axis_within_a_process():
    config = _config(
        distributed={"strategy": "fsdp", "model_parallel": 2}, train={"steps_per_execution": 1}
    )
    topology = distribute.topology_for(
        config.distributed, config.model, _two_hosts(), processes=(2, 0)
    )
    assert make_plan(config, topology=topology).topology.mesh_shape == {"batch": 4, "model": 2}
    assert make_plan(config, _two_hosts(), strategy="data").topology.mesh_shape == {"batch": 8}
    wide = _config(distributed={"strategy": "model", "model_parallel": 8})
    with pytest.raises(ConfigError, match="distributed.model_parallel.*within one process"):
        distribute.topology_for(wide.distributed, wide.model, _two_hosts(), processes=(2, 0))


def test_auto_steps_per_dispatch_follow_the_dispatch_size_rule():
    config = _config(train={"steps_per_execution": AUTO, "log_every": 100})
    devices = _two_hosts(4)
    plan = make_plan(config, devices, sequence_length=32)
    peak = hardware.CHIPS["v4"].bf16_flops * 4
    work = flops.train_flops_per_step(flops.Shape.from_config(config, 32), plan.global_batch)
    k, why = dispatch_size.choose(work, peak, 100)
    assert k > 1  # a tiny model on a TPU: many steps per dispatch
    assert plan.steps_per_dispatch == k and plan.auto_steps and plan.steps_reason == why
    assert plan.config.train.steps_per_execution == k
    assert plan.config == dataclasses.replace(
        config, train=dataclasses.replace(config.train, steps_per_execution=k)
    )
    # On this CPU a seed-sized step already holds the target: the rule says how many.
    cpu = make_plan(config)
    assert (
        cpu.steps_per_dispatch
        == dispatch_size.steps_for(config, throughput.peak_flops(jax.devices()), cpu.global_batch)[
            0
        ]
    )


@pytest.mark.parametrize("masking, slots", [("dynamic", 24), ("static", 28)])
def test_slots_for_static_and_dynamic_masking(masking, slots):
    config = _config(
        data={"masking": masking, "mask_rate": 0.15, "max_predictions": 0},
        train={"steps_per_execution": 1},
    )
    plan = make_plan(config, sequence_length=128)
    # dynamic: ceil(1.25 x 0.15 x 128) = 24; static: ceil(19.2 + 2 x sqrt(128 x 0.15 x 0.85)) = 28
    assert plan.slots == slots == config.data.prediction_slots(128)
    assert plan.sequence_length == 128
    capped = make_plan(
        dataclasses.replace(config, data=dataclasses.replace(config.data, max_predictions=7)),
        sequence_length=128,
    )
    assert capped.slots == 7
    assert make_plan(config).slots == config.data.prediction_slots(32)  # the model's length


def test_prediction_batch_and_group():
    config = _config(train={"batch_size_per_device": 3, "steps_per_execution": 6})
    plan = make_plan(config, strategy="data")
    assert plan.prediction_batch() == 12 and plan.prediction_batch(10) == 12
    assert plan.prediction_batch(16) == 16
    # A fixed group, never more than the batches `examples` fill, rounded up to a power of 2.
    assert [plan.prediction_group(16, 3, n) for n in (None, 70, 40, 3)] == [6, 6, 4, 1]
    auto = make_plan(_config(train={"steps_per_execution": AUTO}), _two_hosts(4), 32)
    peak = throughput.peak_flops(auto.topology.devices)
    expected = dispatch_size.prediction_group(auto.config, peak, 16, 3, 32)
    assert auto.prediction_group(16, 3, examples=1) == expected > 1
    assert auto.prediction_group(16, 3, examples=10**6) == expected  # "auto" pads the last group


def test_the_peak_is_looked_up_once_and_only_when_needed(monkeypatch):
    calls = []
    monkeypatch.setattr(throughput, "peak_flops", lambda devices: calls.append(devices) or 1e12)
    plan = make_plan(_config(train={"steps_per_execution": AUTO}), sequence_length=32)
    assert (plan.process_batch, plan.data_shard) and calls == []  # what a dataset reads
    plan.prediction_group(16, 3)
    assert plan.config.train.steps_per_execution == plan.steps_per_dispatch >= 1
    assert calls == [plan.topology.devices]


def test_a_model_compiled_outside_a_run_gets_its_steps_from_the_plan(monkeypatch):
    from kroberta.model import mlm
    from kroberta.perf.plan import for_local_devices

    config = _config(train={"steps_per_execution": AUTO})
    monkeypatch.setattr(throughput, "peak_flops", lambda devices: None)  # unknown: 32 wanted
    resolved = for_local_devices(config)
    assert resolved == make_plan(config, jax.devices(), strategy="data").config
    assert isinstance(resolved.train.steps_per_execution, int)
    assert dataclasses.replace(resolved.train, steps_per_execution=AUTO) == config.train
    # The model takes a count: "auto" is the plan's to resolve, refused before any work.
    with pytest.raises(ConfigError, match=r'steps_per_execution="auto" must be resolved'):
        mlm.compile_model(None, config)
