"""Fine-tuning speed: kroberta's fine-tuning steps against Hugging Face's Trainer, same model, same batches.

    python tools/bench_finetune.py [--shape origin] [--steps 64] [--rounds 3] [--probe-run runs/default]

One process, one CPU device for kroberta (JAX_PLATFORMS=cpu, no simulated devices) and
torch on the CPU with as many threads as XLA's CPU backend uses (one per core; OpenMP's
threads wait passively, as XLA's do, unless OMP_WAIT_POLICY says otherwise). Both
start from the same weights: a kroberta `RobertaTextClassifier` (`classifiers.build_classifier`,
`reset` from seed 0) exported with `kroberta.interop.hf.export_hf` and loaded as
transformers' `RobertaForSequenceClassification`. Both train on the same token ids:
`steps` x batch random sequences of exactly `--length` tokens (one bucket, no padding,
so both see (batch, length) batches), 6 classes, with the recipe's optimizer (AdamW,
betas 0.9/0.98, eps 1e-6, weight decay 0.01, linear decay after 6% warmup) and dropout 0.1
(hidden, attention, classifier head).
  kroberta  one pass as `kroberta.downstream.trial` runs it: `encoding.dataset` of the
            split shuffled by a seed, then `fit` (jit-compiled steps, steps_per_execution 8);
  HF        `Trainer.train()` with max_steps = steps (its own shuffled DataLoader).
Each side runs once untimed first (compilation; the first Trainer's set-up); then rounds
interleave the two and the table gives medians and the best round, whole calls timed from
start to end. Shapes: "origin" (the small RoBERTa kroberta grew from: vocab 10000, 3 layers,
6 heads, hidden 300, intermediate 600, 64 tokens) or "default" (the default job's: vocab
2048, 2 layers, 4 heads, hidden 128, intermediate 512, 16 tokens).
With --probe-run, also times `kroberta.pretraining.probe.linear_probe` on the embedded
standard-library task for that run's model (first call, with its compilation, and again).
Needs the bench extra (`pip install -e ".[bench]"`): transformers, torch and accelerate
(transformers' Trainer imports it).
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SHAPES = {
    "origin": dict(
        vocabulary_size=10000,
        num_layers=3,
        num_heads=6,
        hidden_dim=300,
        intermediate_dim=600,
        max_sequence_length=64,
    ),
    "default": dict(
        vocabulary_size=2048,
        num_layers=2,
        num_heads=4,
        hidden_dim=128,
        intermediate_dim=512,
        max_sequence_length=16,
    ),
}
NUM_CLASSES = 6
LEARNING_RATE = 1e-4
DROPOUT = 0.1


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="origin")
    p.add_argument("--steps", type=int, default=64, help="training steps per timed call")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--probe-run", help="a run directory whose model the linear probe scores")
    return p.parse_args()


def synthetic_split(config, count: int):
    """`count` sequences of exactly max_sequence_length ids (<s> ... </s>), random labels."""
    import numpy as np

    from kroberta.downstream import encoding

    rng = np.random.default_rng(0)
    length, vocabulary = config.max_sequence_length, config.vocabulary_size
    ids = rng.integers(5, vocabulary, (count, length)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 0, 2
    labels = rng.integers(0, NUM_CLASSES, count).astype(np.int32)
    return encoding.Encoded(list(ids), labels, pad_id=1)


def kroberta_classifier(config, steps: int):
    """The compiled classifier as `kroberta.finetune` builds it, head and weights from seed 0."""
    from kroberta.downstream import classifiers
    from kroberta.downstream.tasks import CLASSIFICATION
    from kroberta.model.mlm import build_model

    classifier = classifiers.build_classifier(config, NUM_CLASSES)
    classifiers.compile_classifier(classifier, CLASSIFICATION, steps, steps_per_execution=8)
    start = classifiers.backbone_weights(build_model(config, seed=0))
    classifiers.reset(classifier, start, 0, LEARNING_RATE)
    return classifier, start


def kroberta_pass_seconds(classifier, start, encoded, batch: int, length: int, seed: int) -> float:
    """One pass as the recipe runs it (the shuffled dataset built, then `fit`)."""
    from kroberta.downstream import classifiers, encoding

    classifiers.reset(classifier, start, seed, LEARNING_RATE)
    began = time.perf_counter()
    data, _ = encoding.dataset(encoded, batch, length, seed)
    classifier.fit(data, epochs=1, verbose=0, shuffle=False)
    return time.perf_counter() - began


def hf_trainer_parts(classifier, encoded, work: str, steps: int, batch: int):
    """(model, its starting state, examples, TrainingArguments) for transformers' Trainer,
    the model being `classifier` exported with kroberta's exporter."""
    import torch
    from transformers import RobertaForSequenceClassification, TrainingArguments

    from kroberta.interop.hf import export_hf

    directory = export_hf(classifier, os.path.join(work, "hf"))
    model = RobertaForSequenceClassification.from_pretrained(directory)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    examples = [
        {
            "input_ids": torch.from_numpy(ids.astype("int64")),
            "attention_mask": torch.ones(len(ids), dtype=torch.int64),
            "labels": int(label),
        }
        for ids, label in zip(encoded.ids, encoded.labels)
    ]
    arguments = TrainingArguments(
        output_dir=os.path.join(work, "trainer"),
        per_device_train_batch_size=batch,
        max_steps=steps,
        learning_rate=LEARNING_RATE,
        weight_decay=0.01,
        adam_beta1=0.9,
        adam_beta2=0.98,
        adam_epsilon=1e-6,
        warmup_steps=0.06,
        lr_scheduler_type="linear",
        logging_strategy="no",
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
    )
    return model, state, examples, arguments


def hf_pass_seconds(model, state, examples, arguments) -> float:
    """`Trainer.train()` of `arguments.max_steps` steps from `state`."""
    from transformers import Trainer

    model.load_state_dict(state)
    trainer = Trainer(model=model, args=arguments, train_dataset=examples)
    began = time.perf_counter()
    trainer.train()
    return time.perf_counter() - began


def probe_seconds(run: str) -> tuple:
    """(first call, second call, validation accuracy) of the linear probe on the embedded task."""
    import kroberta
    from kroberta.downstream import tasks
    from kroberta.pretraining.probe import linear_probe

    model = kroberta.load(run)
    train, validation, names = tasks.stdlib_splits()
    times = []
    for _ in range(2):
        began = time.perf_counter()
        scores = linear_probe(model, tasks.STDLIB_SPEC, train, validation, names)
        times.append(time.perf_counter() - began)
    return times[0], times[1], scores["accuracy"], len(train.labels), len(validation.labels)


def main():
    args = parse_args()
    import importlib.util

    missing = [
        m for m in ("transformers", "torch", "accelerate") if importlib.util.find_spec(m) is None
    ]
    if missing:
        sys.exit(f'error: {", ".join(missing)} not installed: pip install -e ".[bench]"')
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # torch's OpenMP threads spin while they wait: on a shared, loaded machine a spinning
    # thread holds a core another needs (measured: 2 s a step, against 0.13 s passive).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import jax
    import torch
    import transformers

    import kroberta  # noqa: F401  (fixes the backend before keras is imported)
    from kroberta.config import ModelConfig

    threads = os.cpu_count()  # XLA's CPU backend: one intra-op thread per core
    torch.set_num_threads(threads)
    transformers.logging.set_verbosity_error()
    config = ModelConfig(**SHAPES[args.shape], dropout=DROPOUT)
    batch, length, steps = args.batch_size, config.max_sequence_length, args.steps
    encoded = synthetic_split(config, steps * batch)
    classifier, start = kroberta_classifier(config, steps)
    work = tempfile.mkdtemp(prefix="bench-finetune-")
    hf_parts = hf_trainer_parts(classifier, encoded, work, steps, batch)

    kroberta_pass_seconds(classifier, start, encoded, batch, length, seed=99)  # compiles
    hf_pass_seconds(*hf_parts)
    results = {"kroberta": [], "hf": []}
    for round_ in range(args.rounds):
        results["kroberta"].append(
            kroberta_pass_seconds(classifier, start, encoded, batch, length, seed=round_)
        )
        results["hf"].append(hf_pass_seconds(*hf_parts))
        print(
            f"round {round_ + 1}: " + ", ".join(f"{n} {v[-1]:.2f} s" for n, v in results.items()),
            f"(load {os.getloadavg()[0]:.1f})",
            flush=True,
        )

    samples = steps * batch
    rate = {n: samples / statistics.median(v) for n, v in results.items()}
    best = {n: samples / min(v) for n, v in results.items()}
    shape = SHAPES[args.shape]
    print(
        f"\n{args.shape} shape (vocab {shape['vocabulary_size']}, {shape['num_layers']} layers, "
        f"{shape['num_heads']} heads, hidden {shape['hidden_dim']}, intermediate "
        f"{shape['intermediate_dim']}), {length} tokens, batch {batch}, {steps} steps per call, "
        f"{args.rounds} rounds; {len(jax.devices())} JAX CPU device, torch {torch.__version__} "
        f"with {torch.get_num_threads()} threads (XLA CPU: one per core, {threads} cores), "
        f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}; "
        f"load average {os.getloadavg()[0]:.1f} at the end"
    )
    print("| fine-tuning | samples/s, median | best round | x HF (medians) | x HF (best rounds) |")
    print("|---|---|---|---|---|")
    for name, key in (
        ("kroberta (`encoding.dataset` + `fit`, steps_per_execution 8)", "kroberta"),
        (f"Hugging Face `Trainer.train()` (transformers {transformers.__version__})", "hf"),
    ):
        print(
            f"| {name} | {rate[key]:,.1f} | {best[key]:,.1f} | {rate[key] / rate['hf']:.2f} | "
            f"{best[key] / best['hf']:.2f} |"
        )
    if args.probe_run:
        first, again, accuracy, train, validation = probe_seconds(args.probe_run)
        print(
            f"\nlinear probe, {args.probe_run}'s model, embedded task ({train} training, "
            f"{validation} validation docstrings): first call {first:.1f} s (compiling), again "
            f"{again:.1f} s; validation accuracy {100 * accuracy:.1f}%"
        )


if __name__ == "__main__":
    main()
