"""Test set-up: JAX on CPU with 4 simulated devices, set before jax is imported."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
).strip()
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Fixes the backend before any test imports keras, and adds kroberta's CPU flags to
# XLA_FLAGS (Eigen matmuls; an hour before a late collective rendezvous aborts:
# kroberta/runtime/xla_cpu.py), for this process and the subprocesses it starts.
import contextlib  # noqa: E402
import dataclasses  # noqa: E402

import pytest  # noqa: E402

import kroberta  # noqa: E402,F401
from kroberta.config import Config, config_path, load_toml, to_toml  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_LENGTH = 32
TINY_VOCAB = 512


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """Synthetic seed-format TFRecords for the tiny config: 2 train files + 1 validation."""
    from kroberta.data.synthetic import write_seed_format

    root = tmp_path_factory.mktemp("tiny_data")
    for i in range(2):
        write_seed_format(
            str(root / f"train-{i}.tfrecord"), 256, TINY_LENGTH, TINY_VOCAB, seed=i + 1
        )
    write_seed_format(str(root / "validation.tfrecord"), 70, TINY_LENGTH, TINY_VOCAB, seed=9)
    return root


def prepare_word_corpus(root, words, documents: int, vocab_size: int = 300, seq_len: int = 32):
    """A corpus of random sentences of `words`, prepared under root/data (returns that path)."""
    import random

    from kroberta import prepare

    rng = random.Random(0)
    text = "".join(
        "The " + " ".join(rng.choice(words) for _ in range(rng.randint(5, 15))) + " ends here.\n\n"
        for _ in range(documents)
    )
    (root / "corpus.txt").write_text(text)
    prepare(
        [str(root / "corpus.txt")],
        str(root / "data"),
        vocab_size=vocab_size,
        seq_len=seq_len,
        validation_fraction=0.05,
        progress=False,
    )
    return root / "data"


def serialize_example(features: dict, floats=()) -> bytes:
    """A record built with TensorFlow's own protos (not kroberta's serializer): int64 lists,
    float lists for the names in `floats`; a feature whose values are None is left out."""
    import tensorflow as tf

    feature = {}
    for name, values in features.items():
        if values is None:
            continue
        if name in floats:
            feature[name] = tf.train.Feature(
                float_list=tf.train.FloatList(value=list(map(float, values)))
            )
        else:
            feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_records(path, payloads) -> str:
    """Serialized records, framed as a TFRecord file by TensorFlow's writer."""
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path)) as writer:
        for payload in payloads:
            writer.write(payload)
    return str(path)


def saved_tiny_model(run_dir, config, seed: int):
    """`config`'s freshly initialised model saved as a run in `run_dir`, loaded back."""
    from kroberta.model.mlm import build_model
    from kroberta.training import final_model

    (run_dir / "config.toml").write_text(to_toml(config))
    final_model.save(build_model(config.model, seed=seed), str(run_dir))
    return kroberta.load(str(run_dir))


def load_tool(name: str):
    """The module of the standalone script tools/<name>.py (tools are scripts, not a
    package: loaded by path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "tools", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_config(data_dir, run_dir, **train_overrides) -> Config:
    """The shipped tiny config pointed at `data_dir`, writing to `run_dir`."""
    config = load_toml(config_path("tiny"))
    data = dataclasses.replace(
        config.data,
        train=(str(data_dir / "train-*.tfrecord"),),
        validation=(str(data_dir / "validation.tfrecord"),),
    )
    train = dataclasses.replace(config.train, **train_overrides)
    return dataclasses.replace(config, data=data, train=train, run_dir=str(run_dir))


@pytest.fixture(scope="session")
def downstream_model():
    """The shipped tiny config's model (hidden 32, 2 layers, 32 tokens), randomly
    initialised, with a byte-level BPE tokenizer trained on WORDS."""
    import warnings

    from kroberta.config import config_path, load_toml
    from kroberta.model.mlm import build_model
    from kroberta.text.tokenizer import VocabularyShortfallWarning, train_tokenizer
    from tests.downstream.tasks import sentences

    config = load_toml(config_path("tiny"))
    with warnings.catch_warnings():  # fewer tokens than asked for: expected, and fine
        warnings.simplefilter("ignore", VocabularyShortfallWarning)
        tokenizer = train_tokenizer(sentences(400, 0, marked=lambda i: i % 2), 400, min_frequency=1)
    assert tokenizer.get_vocab_size() <= config.model.vocabulary_size
    return build_model(config.model, seed=0, config=config, tokenizer=tokenizer)


@contextlib.contextmanager
def jit_traces():
    """The names of the functions `jax.jit` traces inside the block (JAX's monitoring
    events): empty when everything ran on programs compiled before."""
    import jax

    names = []

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/jaxpr_trace_duration":
            names.append(kwargs.get("fun_name"))

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield names
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
