"""Shared pieces of the downstream tests: synthetic labelled tasks (the tiny model with a
tokenizer is the `downstream_model` fixture of tests/conftest.py)."""

import json
import random

WORDS = (
    "apple",
    "river",
    "stone",
    "cloud",
    "green",
    "table",
    "music",
    "paper",
    "light",
    "house",
    "dream",
    "bread",
    "clock",
    "water",
    "tiger",
    "zebra",
)
MARKER = "zebra"  # the synthetic task's label: whether this word appears


def sentences(count: int, seed: int, marked=None):
    """`count` sentences of 4-9 words; `marked(i)` says whether sentence i holds MARKER."""
    rng = random.Random(seed)
    result = []
    for i in range(count):
        words = [rng.choice(WORDS[:-1]) for _ in range(rng.randint(6, 11))]
        if marked is not None and marked(i):
            words[rng.randrange(len(words))] = MARKER
        result.append("The " + " ".join(words))  # every word after a space: one token each
    return result


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def marker_task(root, train: int = 384, validation: int = 128, random_labels: bool = False):
    """(train, validation) JSON-lines files: label 1 iff MARKER is in the text (or a
    coin flip independent of the text with random_labels)."""
    paths = []
    for name, count, seed in (("train", train, 1), ("validation", validation, 2)):
        rng = random.Random(seed + 100)
        flags = [rng.random() < 0.5 for _ in range(count)]
        texts = sentences(count, seed, marked=lambda i, flags=flags: flags[i])
        labels = [int(rng.random() < 0.5) if random_labels else int(f) for f in flags]
        paths.append(
            write_jsonl(
                root / f"{name}.jsonl", [{"text": t, "label": y} for t, y in zip(texts, labels)]
            )
        )
    return paths
