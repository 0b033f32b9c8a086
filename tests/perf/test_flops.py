import json

import pytest

from kroberta.config import ModelConfig, config_path, load_toml
from kroberta.perf import flops, throughput

# 1 layer, hidden 2 (1 head of 2), intermediate 4, vocabulary 3, 2 tokens, 1 slot.
DEGENERATE = flops.Shape(
    layers=1, hidden=2, intermediate=4, heads=1, vocabulary=3, length=2, slots=1
)


@pytest.mark.fast
def test_degenerate_forward_flops_by_hand():
    parts = flops.forward_breakdown(DEGENERATE)
    assert parts == {
        "qkv": 3 * 2 * 2 * 2 * 2,  # 3 projections x 2 FLOPs x L=2 x H=2 x H=2 = 48
        "attention_output": 2 * 2 * 2 * 2,  # 16
        "feed_forward": 2 * 2 * 2 * 2 * 4,  # up and down, 2 x 2 x L x H x I = 64
        "attention_scores": 2 * 2 * 2 * 2,  # 2 x L x L x H = 16
        "attention_values": 2 * 2 * 2 * 2,  # 16
        "head_dense": 2 * 1 * 2 * 2,  # M=1: 8
        "head_vocabulary": 2 * 1 * 2 * 3,  # 12
    }
    assert flops.forward_flops_per_sequence(DEGENERATE) == 180
    assert flops.train_flops_per_sequence(DEGENERATE) == 3 * 180
    assert flops.flops_per_token(DEGENERATE, train=False) == 90
    assert flops.train_flops_per_step(DEGENERATE, global_batch=4) == 4 * 540


@pytest.mark.fast
def test_train_is_three_forwards_for_every_shipped_config():
    for name in ("tiny", "seed", "base"):
        shape = flops.Shape.from_config(load_toml(config_path(name)))
        assert flops.train_flops_per_sequence(shape) == 3 * flops.forward_flops_per_sequence(shape)


@pytest.mark.fast
def test_seed_step_flops_near_xla_measurement():
    # DESIGN.md section 4: XLA's cost_analysis of the seed train step (keras-hub backbone,
    # sparse head at 12 slots, 8 sequences per core, AdamW) is 10.1 GFLOP per core.
    # The analytic count has matmuls only; XLA also counts softmax, layer norms, GELU,
    # dropout, the loss and the AdamW update (~5.3M parameters x ~15 FLOPs each), so
    # it must be a bit lower: between 75% and 100% of XLA's figure.
    seed = load_toml(config_path("seed"))
    shape = flops.Shape.from_config(seed, length=64, slots=12)
    per_core_step = flops.train_flops_per_step(shape, global_batch=8)
    assert per_core_step == pytest.approx(8.769e9, rel=1e-3)
    assert 0.75 * 10.1e9 <= per_core_step <= 10.1e9
    # and predict (forward only) vs XLA's 3.06 GFLOP per core
    forward = 8 * flops.forward_flops_per_sequence(shape)
    assert 0.85 * 3.06e9 <= forward <= 3.06e9


def test_parameter_count_matches_the_built_model():
    from kroberta.model.mlm import build_model, count_parameters

    model = ModelConfig(
        vocabulary_size=300,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=24,
        max_sequence_length=12,
    )
    assert flops.parameter_count(model) == count_parameters(build_model(model))
    seed = load_toml(config_path("seed"))
    assert flops.parameter_count(seed.model) == 5_290_600  # count_parameters of the built model


@pytest.mark.fast
def test_memory_estimate_counts_weights_gradients_and_two_moments():
    memory = flops.memory_estimate(DEGENERATE, parameters=1000, batch_per_device=2)
    assert (memory.parameters, memory.gradients, memory.optimizer) == (4000, 4000, 8000)
    assert memory.activations > 0 and memory.total == 16000 + memory.activations


@pytest.mark.fast
def test_mfu_and_peaks(tmp_path, monkeypatch):
    class FakeDevice:
        platform, device_kind = "tpu", "TPU v3"

    assert throughput.peak_flops([FakeDevice()] * 8) == pytest.approx(8 * 61.5e12)
    assert throughput.mfu(61.5e12, 123e12) == pytest.approx(0.5)
    assert throughput.mfu(1.0, None) is None
    # The CPU peak is measured once, cached, and only ever raised by a re-measurement.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []
    monkeypatch.setattr(throughput, "measure_matmul_flops", lambda *a, **k: calls.append(1) or 5e10)
    assert throughput.cpu_peak_flops() == 5e10
    assert throughput.cpu_peak_flops() == 5e10 and len(calls) == 1
    cached = json.loads((tmp_path / "kroberta" / "cpu_peak.json").read_text())
    assert list(cached.values()) == [5e10] and "jax devices" in next(iter(cached))
    monkeypatch.setattr(throughput, "measure_matmul_flops", lambda *a, **k: 1e10)
    assert throughput.cpu_peak_flops(refresh=True) == 5e10  # a busy machine measures low
    # A run that did more model FLOP/s than the peak: the peak kept is at least its rate.
    assert throughput.cpu_peak_flops(refresh=True, at_least=8e10) == 8e10
    assert list(json.loads((tmp_path / "kroberta" / "cpu_peak.json").read_text()).values()) == [
        8e10
    ]


@pytest.mark.fast
def test_an_implausible_cpu_peak_is_neither_used_nor_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    # e.g. a test's fake clock made the matmul look instantaneous
    monkeypatch.setattr(throughput, "measure_matmul_flops", lambda *a, **k: 4.7e15)
    assert throughput.cpu_peak_flops() is None
    assert not (tmp_path / "kroberta" / "cpu_peak.json").exists()


@pytest.mark.fast
def test_the_machine_peak_counts_every_simulated_device(monkeypatch):
    import jax

    from kroberta.perf import throughput

    devices = jax.devices("cpu")
    assert len(devices) == 4
    # Run for real once: every device's matmul checked against its expected value.
    assert throughput.measure_matmul_flops(devices, size=256, repeats=1) > 0
    # Timed on a shared machine two rates are noise; with the matmul's time fixed, four
    # matmuls at once count four times the work of one.
    monkeypatch.setattr(throughput, "_best_time", lambda *args, **kwargs: 0.01)
    together = throughput.measure_matmul_flops(devices, size=256, repeats=1)
    assert together == 4 * throughput.measure_matmul_flops(devices[:1], size=256, repeats=1)
    assert together == 4 * 2 * 256**3 / 0.01
