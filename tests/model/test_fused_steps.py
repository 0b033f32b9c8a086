"""K optimizer steps per dispatch (kroberta.model.fused_steps): same results as one step at a
time, honest interval metrics, resume inside a group, one compilation per program."""

import dataclasses

import jax
import numpy as np
import pytest

from kroberta import train
from kroberta.config import AUTO, validate
from kroberta.data import pipeline
from kroberta.errors import ConfigError
from kroberta.model import fused_steps, masked_lm
from kroberta.perf import dispatch_size
from kroberta.perf.plan import make_plan
from tests.conftest import tiny_config
from tests.pretraining.test_train import (  # the run-dir readers the training tests use
    _rows,
    _weights,
)

# 20 steps: two log intervals of 8, then a last one of 4 (a short group for K = 8).
RUN = dict(steps=20, warmup_steps=4, eval_every=16, checkpoint_every=16)


def _assert_same_weights(a, b):
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys() and len(wa) > 20
    for name in wa:
        np.testing.assert_allclose(wb[name], wa[name], rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.fixture(scope="module")
def runs(tiny_data, tmp_path_factory):
    """K=1 logging every step, K=8 logging every 8 steps, and K=4 stopped at step 10 (in
    the middle of its third group) then resumed."""
    root = tmp_path_factory.mktemp("fused")
    one = tiny_config(tiny_data, root / "k1", steps_per_execution=1, log_every=1, **RUN)
    eight = tiny_config(tiny_data, root / "k8", steps_per_execution=8, log_every=8, **RUN)
    four = tiny_config(tiny_data, root / "k4", steps_per_execution=4, log_every=8, **RUN)
    summaries = {"k1": train(one), "k8": train(eight)}
    summaries["k4-first"] = train(four, until_step=10)
    summaries["k4"] = train(four)
    return root, summaries


def test_k1_and_k8_end_with_the_same_weights(runs):
    root, summaries = runs
    assert summaries["k1"]["final_step"] == summaries["k8"]["final_step"] == 20
    _assert_same_weights(root / "k1", root / "k8")
    assert [r["step"] for r in _rows(root / "k8")] == [8, 16, 20]
    validation = [(r["step"], r["loss"]) for r in _rows(root / "k8", "validation")]
    expected = [(r["step"], r["loss"]) for r in _rows(root / "k1", "validation")]
    assert [s for s, _ in validation] == [s for s, _ in expected] == [16, 20]
    np.testing.assert_allclose([v for _, v in validation], [v for _, v in expected], rtol=1e-6)


def test_logged_interval_is_the_token_weighted_mean_of_its_steps(runs, tiny_data):
    root, _ = runs
    config = tiny_config(tiny_data, root / "k1", **RUN)
    spec = pipeline.inspect_files(pipeline.resolve_files(config.data.train, "t"), "t")
    batches = (
        pipeline.train_dataset(
            spec, config.data, config.model.vocabulary_size, 16, config.train.seed, 0
        )
        .take(20)
        .as_numpy_iterator()
    )
    tokens = [int((y != -100).sum()) for _, y in batches]  # masked tokens of each step
    per_step = _rows(root / "k1")
    assert [r["step"] for r in per_step] == list(range(1, 21))
    assert len(set(tokens)) > 1  # steps of unequal weight: a plain mean would differ
    for row, (begin, end) in zip(_rows(root / "k8"), [(0, 8), (8, 16), (16, 20)]):
        w = np.array(tokens[begin:end], float)
        for key in ("loss", "masked_accuracy"):
            values = np.array([r[key] for r in per_step[begin:end]])
            assert row[key] == pytest.approx(
                float((w * values).sum() / w.sum()), rel=2e-6, abs=1e-7
            ), (key, end)
        plain = np.mean([r["loss"] for r in per_step[begin:end]])
        assert abs(row["loss"] - plain) > 1e-6 or end == 20  # the weights made a difference
        if "step_time" in row:  # not in the first row: its one dispatch compiled
            assert row["step_time"] == pytest.approx(16 / row["samples_per_second"])


def test_resume_inside_a_group_ends_like_the_uninterrupted_runs(runs):
    root, summaries = runs
    assert summaries["k4-first"]["final_step"] == 10
    assert summaries["k4"]["start_step"] == 10 and summaries["k4"]["final_step"] == 20
    _assert_same_weights(root / "k1", root / "k4")
    # The first invocation logged at 8 and at its stop (10); the resume realigns at 16.
    assert [r["step"] for r in _rows(root / "k4")] == [8, 10, 16, 20]
    assert _rows(root / "k4")[-1]["loss"] == pytest.approx(_rows(root / "k8")[-1]["loss"], rel=1e-6)


def test_fused_programs_compile_once_per_group_length(tiny_data, tmp_path):
    """Stack-specific in its trace counts: Keras 3.15 (kroberta's override) scans a short
    last group at its own length, one more trace; Keras >= 3.16 runs it step by step
    through the one-step program its scan already traced, so no new trace."""
    from kroberta.model.mlm import build_compiled_model

    short_group_traces = 1 if fused_steps.KERAS_FUSES_STEPS else 2

    config = tiny_config(tiny_data, tmp_path, steps_per_execution=4, log_every=8, **RUN)
    spec = pipeline.inspect_files(pipeline.resolve_files(config.data.train, "t"), "t")
    model = build_compiled_model(config)

    def stream(begin):
        return pipeline.train_dataset(spec, config.data, config.model.vocabulary_size, 16, 0, begin)

    model.fit(stream(0).take(16), steps_per_epoch=8, epochs=2, verbose=0)
    assert masked_lm.trace_count(model, "train") == 1
    assert int(model.optimizer.iterations.numpy()) == 16
    model.fit(stream(16).take(8), steps_per_epoch=8, epochs=1, verbose=0)
    assert masked_lm.trace_count(model, "train") == 1  # the same program again
    model.fit(stream(24).take(6), steps_per_epoch=6, epochs=1, verbose=0)  # groups of 4, 2
    assert masked_lm.trace_count(model, "train") == short_group_traces  # the short group
    assert int(model.optimizer.iterations.numpy()) == 30
    val = pipeline.inspect_files((str(tiny_data / "validation.tfrecord"),), "v")
    eval_ds = pipeline.eval_dataset(val, config.data, config.model.vocabulary_size, 16, 0, 0)
    first = model.evaluate(eval_ds, verbose=0, return_dict=True)
    second = model.evaluate(eval_ds, verbose=0, return_dict=True)
    # 70 records in batches of 16: 5 batches = a group of 4 and a group of 1.
    assert masked_lm.trace_count(model, "test") == short_group_traces
    assert first == second
    with pytest.raises(
        ValueError, match="steps_per_epoch=6 is not a multiple of steps_per_execution=4"
    ):
        model.fit(stream(0), steps_per_epoch=6, epochs=2, verbose=0)


def test_a_one_device_mesh_compiles_each_step_once(tiny_data, tmp_path):
    """On a mesh of one device Keras leaves a fresh value (the first weights, a metric
    reset at each interval) on the device's own sharding, which JAX's compilation cache
    tells apart from the compiled step's outputs: without the training model's placement
    the first dispatch, the second and each interval's first would compile three programs."""
    import keras

    from kroberta.model.mlm import build_compiled_model
    from kroberta.parallel import distribute

    config = tiny_config(tiny_data, tmp_path, steps_per_execution=4, log_every=8, **RUN)
    config = dataclasses.replace(
        config, distributed=dataclasses.replace(config.distributed, devices=1)
    )
    spec = pipeline.inspect_files(pipeline.resolve_files(config.data.train, "t"), "t")
    val = pipeline.inspect_files((str(tiny_data / "validation.tfrecord"),), "v")
    previous = keras.distribution.distribution()
    try:
        topology = distribute.setup(config.distributed, config.model)
        assert len(topology.devices) == 1
        model = build_compiled_model(config)
        train_ds = pipeline.train_dataset(spec, config.data, config.model.vocabulary_size, 16, 0)
        model.fit(train_ds.take(24), steps_per_epoch=8, epochs=3, verbose=0)
        assert int(model.optimizer.iterations.numpy()) == 24
        assert masked_lm.trace_count(model, "train") == 1
        eval_ds = pipeline.eval_dataset(
            val, config.data, config.model.vocabulary_size, 16, 0, max_batches=4
        )  # one group of K = 4
        first = model.evaluate(eval_ds, verbose=0, return_dict=True)
        second = model.evaluate(eval_ds, verbose=0, return_dict=True)
        assert masked_lm.trace_count(model, "test") == 1
        assert first == second
    finally:
        keras.distribution.set_distribution(previous)


def test_evaluate_with_k_groups_equals_one_batch_at_a_time(tiny_data, tmp_path):
    from kroberta.model.mlm import build_compiled_model

    val = pipeline.inspect_files((str(tiny_data / "validation.tfrecord"),), "v")
    results = []
    for k in (1, 3):
        config = tiny_config(
            tiny_data,
            tmp_path,
            steps_per_execution=k,
            log_every=6,
            eval_every=0,
            checkpoint_every=0,
        )
        model = build_compiled_model(config)
        eval_ds = pipeline.eval_dataset(val, config.data, config.model.vocabulary_size, 16, 0, 0)
        results.append(model.evaluate(eval_ds, verbose=0, return_dict=True))
    for key in ("masked_accuracy", "perplexity"):
        assert results[1][key] == pytest.approx(results[0][key], rel=1e-6)


def test_fit_over_a_finite_dataset_reads_it_once_per_epoch(tiny_data, tmp_path):
    import tensorflow as tf

    from kroberta.model.mlm import build_compiled_model

    config = tiny_config(
        tiny_data, tmp_path, steps_per_execution=4, log_every=4, eval_every=0, checkpoint_every=0
    )
    model = build_compiled_model(config)
    spec = pipeline.inspect_files(pipeline.resolve_files(config.data.train, "t"), "t")
    flat = list(
        pipeline.train_dataset(spec, config.data, config.model.vocabulary_size, 16, 0, 0)
        .take(6)
        .as_numpy_iterator()
    )
    dataset = tf.data.Dataset.from_tensor_slices(jax.tree.map(lambda *a: np.stack(a), *flat))
    history = model.fit(dataset, epochs=3, verbose=0)  # 6 batches: groups of 4 and 2
    assert int(model.optimizer.iterations.numpy()) == 18
    assert len(history.history["loss"]) == 3


def test_fit_on_numpy_arrays_stacks_groups_on_the_host(tiny_data, tmp_path):
    from kroberta.model.mlm import build_compiled_model

    config = tiny_config(
        tiny_data, tmp_path, steps_per_execution=2, log_every=2, eval_every=0, checkpoint_every=0
    )
    model = build_compiled_model(config)
    spec = pipeline.inspect_files(pipeline.resolve_files(config.data.train, "t"), "t")
    x, y = next(
        pipeline.train_dataset(
            spec, config.data, config.model.vocabulary_size, 64, 0, 0
        ).as_numpy_iterator()
    )
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)  # 4 batches, 2 groups
    assert int(model.optimizer.iterations.numpy()) == 4
    assert masked_lm.trace_count(model, "train") == 1


def test_super_batches_keep_the_k_axis_whole_and_split_the_batch():
    import keras

    devices = jax.devices()[:4]
    distribution = keras.distribution.DataParallel(devices=devices)
    sharding = fused_steps.super_batch_sharding(distribution, (8, 16, 32))
    assert sharding.spec == jax.sharding.PartitionSpec(None, "batch", None)
    arrays = list(
        fused_steps.prefetch_to_devices(
            iter([{"a": np.arange(8 * 16).reshape(8, 16) + i} for i in range(3)]), distribution
        )
    )
    assert len(arrays) == 3
    assert [s.data.shape for s in arrays[0].data["a"].addressable_shards] == [(8, 4)] * 4
    np.testing.assert_array_equal(
        np.asarray(arrays[2].data["a"]), np.arange(128).reshape(8, 16) + 2
    )


def test_log_interval_must_be_a_multiple_of_k(tiny_data, tmp_path):
    # Evaluations and checkpoints are multiples of log_every, hence of K too.
    config = tiny_config(
        tiny_data, tmp_path, steps_per_execution=8, log_every=12, eval_every=24, checkpoint_every=24
    )
    with pytest.raises(
        ConfigError,
        match=r"train\.log_every: 12 is not a multiple of "
        r"train\.steps_per_execution=8",
    ):
        validate(config)


def test_steps_per_execution_takes_a_count_or_auto(tiny_data, tmp_path):
    from kroberta.config import Config, apply_overrides

    config = apply_overrides(Config(), ["train.steps_per_execution=auto"])
    assert config.train.steps_per_execution == AUTO == Config().train.steps_per_execution
    with pytest.raises(
        ConfigError,
        match=r"train\.steps_per_execution: expected an integer or "
        r"\"auto\", got 'often'",
    ):
        apply_overrides(config, ["train.steps_per_execution=often"])
    with pytest.raises(ConfigError, match=r"train\.steps_per_execution: must be >= 1"):
        validate(tiny_config(tiny_data, tmp_path, steps_per_execution=0))


def test_auto_fills_a_dispatch_with_enough_work():
    # A step of 1 GFLOP at 1 TFLOP/s is 1 ms: 20 of them hold the target 20 ms.
    assert dispatch_size.choose(1e9, 1e12, log_every=100)[0] == 20
    assert dispatch_size.choose(1e9, 1e12, log_every=50)[0] == 10  # largest divisor <= 20
    assert dispatch_size.choose(1e12, 1e12, log_every=50)[0] == 1  # 1 s a step: no fusing
    assert dispatch_size.choose(1e6, 1e15, log_every=1000)[0] == 250  # capped at 256 -> 250
    k, why = dispatch_size.choose(1e9, None, log_every=64)
    assert k == 32 and "unknown" in why


def test_the_plan_resolves_the_automatic_choice(tiny_data, tmp_path):
    config = tiny_config(
        tiny_data, tmp_path, steps=4, log_every=2, eval_every=0, checkpoint_every=0, warmup_steps=0
    )
    assert config.train.steps_per_execution == AUTO
    plan = make_plan(config, jax.devices(), 32)
    resolved = plan.config
    k = resolved.train.steps_per_execution
    assert k in (1, 2) and plan.global_batch == 16
    assert plan.auto_steps and plan.steps_reason  # what training logs with K
    assert dataclasses.replace(resolved.train, steps_per_execution=AUTO) == config.train
