"""A linear probe: how much of a task the frozen model's embeddings already hold.

Cheap enough to run during pretraining (`train.downstream`): the task is read and
tokenised once (`prepare_task`, `from_setting`); each probe is one compiled prediction
pass over every split (`kroberta.predict(..., output="embeddings")`, the mean of the
last hidden states over the real tokens), then ridge regression in closed form on the
standardised embeddings (one-hot targets for classification, argmax to predict). No
gradient step touches the model.
"""

import dataclasses
import os

import jax
import numpy as np

from kroberta.downstream import encoding, metrics, results
from kroberta.downstream.tasks import CLASSIFICATION, REGRESSION, TaskSpec, read_task
from kroberta.errors import ConfigError
from kroberta.inference.prediction import predict
from kroberta.run_layout import load_tokenizer
from kroberta.training.run_dir import PROBE_GAP

RIDGE = 1.0  # the L2 penalty on standardised features


@dataclasses.dataclass(frozen=True)
class ProbeTask:
    """A task tokenised once: `inputs` {"input_ids", "attention_mask"}, each (n, length)
    int32, holds the rows of every split of `labels` ({split: (n_split,)}, "train"
    first) in that order."""

    name: str
    spec: TaskSpec
    label_names: tuple | None
    inputs: dict
    labels: dict

    @property
    def main_metric(self) -> str:
        """The task's first metric: the one a run's verdict is about."""
        return self.spec.metrics(len(self.label_names or ()))[0]

    # The methods a run's callback calls (it holds the task, not this module: below it).
    def predictions(self, model) -> dict:
        """{split: (n_split,) predictions} of a ridge probe fitted on the "train" split's
        embeddings, for each other split of the task (class ids, or values for regression)."""
        # (n, hidden): every split in one prediction pass.
        embeddings = predict(model, self.inputs, output="embeddings")["embeddings"]
        ends = np.cumsum([len(labels) for labels in self.labels.values()])[:-1]
        features = dict(zip(self.labels, np.split(np.asarray(embeddings, np.float64), ends)))
        train = features.pop("train")
        mean, scale = train.mean(0), train.std(0) + 1e-6

        def standardised(f):  # (n, hidden + 1): with a bias column
            return np.c_[(f - mean) / scale, np.ones(len(f))]

        x_train, labels = standardised(train), self.labels["train"]
        regression = self.spec.kind == REGRESSION
        targets = (
            labels[:, None].astype(np.float64)
            if regression
            else np.eye(len(self.label_names))[labels]
        )  # (n, K)
        gram = x_train.T @ x_train + RIDGE * np.eye(x_train.shape[1])
        weights = np.linalg.solve(gram, x_train.T @ targets)  # (hidden + 1, K)
        result = {}
        for split, f in features.items():
            outputs = standardised(f) @ weights
            result[split] = outputs[:, 0] if regression else outputs.argmax(-1)
        return result

    def scores(self, predicted: dict) -> dict:
        """{split: {metric: value}} of `predictions`' result."""
        names = self.spec.metrics(len(self.label_names or ()))
        return {
            split: metrics.score(names, self.labels[split], p) for split, p in predicted.items()
        }

    def gaps(self, predicted: dict, reference: dict) -> dict:
        """{split: {PROBE_GAP, PROBE_GAP + "_low", PROBE_GAP + "_high"}}: the main
        metric of `predicted` minus that of `reference` (the same probe on a random
        initialisation, `predictions`' results both) on each split's texts, with its 95%
        bootstrap interval over those texts (`results.bootstrap_interval`): how far the
        pretrained model is above the random line, and how much of that the choice of texts
        could make."""
        metric = self.main_metric
        out = {}
        for split, ours in predicted.items():
            labels, theirs = self.labels[split], reference[split]
            score = metrics.METRICS[metric]
            low, high = results.bootstrap_interval(metric, labels, ours[None], theirs[None])
            out[split] = {
                PROBE_GAP: score(labels, ours) - score(labels, theirs),
                f"{PROBE_GAP}_low": low,
                f"{PROBE_GAP}_high": high,
            }
        return out


def prepare_task(
    tokenizer, spec, label_names, splits: dict, max_length: int, name: str | None = None
) -> ProbeTask:
    """Tokenises `splits` ({split: LabelledSet}, "train" first) for `scores`."""
    encoded = [encoding.encode(tokenizer, s.texts, s.labels, max_length) for s in splits.values()]
    padded = [encoding.pad(e, np.arange(len(e.ids)), len(e.ids), max_length)[0] for e in encoded]
    inputs = {
        "input_ids": np.concatenate([x["token_ids"] for x in padded]),
        "attention_mask": np.concatenate([x["padding_mask"] for x in padded]),
    }
    return ProbeTask(
        name or spec.name,
        spec,
        label_names,
        inputs,
        {split: s.labels for split, s in splits.items()},
    )


def from_setting(downstream: dict, tokenizer, max_length: int) -> ProbeTask:
    """The task `train.downstream` names (checked by the config), read and tokenised."""
    setting = dict(downstream)
    spec, names, train, evaluation = read_task(
        setting.get("task"),
        setting.get("data"),
        setting.get("validation"),
        setting.get("text_fields", ("text",)),
        setting.get("label_field", "label"),
        setting.get("kind", CLASSIFICATION),
    )
    name = setting.get("task") or os.path.splitext(os.path.basename(setting["data"]))[0]
    return prepare_task(tokenizer, spec, names, {"train": train, **evaluation}, max_length, name)


def for_run(config, sequence_length: int) -> ProbeTask | None:
    """The probe of a pretraining run (`train.downstream`, None when it names no task),
    tokenised with the run's tokenizer; the run's callback scores each checkpoint on it
    (`kroberta.training.run_callbacks.RunLogger`)."""
    if not config.train.downstream:
        return None
    if jax.process_count() > 1:
        raise ConfigError(
            "train.downstream: the probe runs in single-process jobs only "
            "(kroberta.predict gathers its results on one host); remove it here"
        )
    tokenizer = load_tokenizer(config.run_dir)
    if tokenizer is None:
        raise ConfigError(
            "train.downstream: needs the run's tokenizer; train on a prepared "
            "directory (data.dir) or the embedded default data"
        )
    return from_setting(config.train.downstream, tokenizer, sequence_length)


def scores(model, task: ProbeTask) -> dict:
    """{split: {metric: value}} of a ridge probe fitted on the "train" split's embeddings,
    for each other split of `task`."""
    return task.scores(task.predictions(model))


def linear_probe(model, spec, train, validation, label_names, max_length: int | None = None):
    """Scores a ridge probe on the frozen model's pooled embeddings.

    Args:
        model: a kroberta model with a tokenizer.
        spec: the task (`TaskSpec`); train, validation: `LabelledSet`s.
        label_names: the class names (None for regression).
        max_length: tokens per sequence (default: the model's max_sequence_length).

    Returns:
        {metric: value} on the validation split.
    """
    max_length = max_length or model.kroberta_config.model.max_sequence_length
    task = prepare_task(
        model.tokenizer, spec, label_names, {"train": train, "validation": validation}, max_length
    )
    return scores(model, task)["validation"]
