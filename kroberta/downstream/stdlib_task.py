"""The embedded downstream task: which package of the standard library a docstring is from.

Text every machine has, as the default pretraining corpus (`kroberta.text.corpus`,
whose reader this reuses: docstrings read with `ast`, never by importing). The label
is the top-level package (asyncio, email, ...); the split is by module, so no file
gives docstrings to both training and validation, and a model must recognise a
package's register, not memorise a file. The default pretraining corpus leaves the
validation modules out: the task scores text the pretrained model never read. Each class is capped so that no package
dominates (chance is about 1 / the number of classes).
"""

import sysconfig

import numpy as np

from kroberta.downstream.examples import LabelledSet, TaskSpec
from kroberta.text import corpus

PACKAGES = corpus.TASK_PACKAGES  # tried in this order
NUM_CLASSES = 6
PER_CLASS = (320, 80)  # at most this many (training, validation) docstrings per package
SPEC = TaskSpec("stdlib", ("text",), "label")


def _package_splits(root: str, package: str) -> tuple[list, list]:
    """(training, validation) docstrings of one package, split by module
    (`corpus.task_modules`: the default pretraining corpus leaves the validation ones out)."""
    return tuple([" ".join(doc.split()) for path in files for doc in corpus.file_docstrings(path)]
                 for files in corpus.task_modules(root, package))


def splits(root: str | None = None, seed: int = 0):
    """The task's (train, validation) `LabelledSet`s and its label names.

    Args:
        root: the stdlib directory (default: this interpreter's).
        seed: which docstrings a capped package keeps.
    """
    root = root or sysconfig.get_paths()["stdlib"]
    rng = np.random.default_rng(seed)
    chosen = {}
    for package in PACKAGES:
        train, validation = _package_splits(root, package)
        if len(train) >= PER_CLASS[0] // 4 and len(validation) >= PER_CLASS[1] // 4:
            chosen[package] = (train, validation)
        if len(chosen) == NUM_CLASSES:
            break
    names = tuple(chosen)
    result = []
    for part, cap in enumerate(PER_CLASS):
        texts, labels = [], []
        for label, package in enumerate(names):
            docs = chosen[package][part]
            keep = sorted(rng.permutation(len(docs))[:cap])
            texts += [docs[i] for i in keep]
            labels += [label] * len(keep)
        result.append(LabelledSet(f"<stdlib {('train', 'validation')[part]}>", (texts,),
                                  np.array(labels, np.int32)))
    return result[0], result[1], names
