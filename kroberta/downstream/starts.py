"""The backbone weights a fine-tuning trial starts from.

The pretrained start is the model's body; the random start of seed s a fresh body of
its shape drawn with seed 10,000 + s (`baseline`). The recipe's options change them
before any trial: `adapt_steps` trains each start on the task's texts first (the random
starts too, with the same steps, masks and order, so that the comparison of the two
stays a test of pretraining alone: `kroberta.downstream.adaptation`); `reinit_layers`
replaces the pretrained start's top K encoder layers with those of the seed's random
start (the random start is random there already).
"""

import logging

from kroberta.downstream import adaptation
from kroberta.downstream.classifiers import backbone_weights
from kroberta.downstream.layer_decay import ENCODER_LAYER
from kroberta.downstream.settings import FinetuneConfig
from kroberta.model.mlm import build_model

RANDOM_SEEDS = 10_000  # the random start of seed s is drawn with seed 10,000 + s

logger = logging.getLogger(__name__)


class Adaptation:
    """The task-adaptive pretraining of a fine-tune's starts: the training texts packed
    once, the pretrained start adapted once, each random start when it is first asked
    for; the masked-LM losses before and after are kept for the result."""

    def __init__(self, model, texts: tuple, setup):
        self.config, self.tokenizer = model.kroberta_config, model.tokenizer
        self.sequences = adaptation.task_sequences(self.tokenizer, texts, setup.max_length)
        self.steps, self.batch_size = setup.config.adapt_steps, setup.batch_size
        self.seed = self.config.train.seed  # the same masks and order for every start
        self.measured = {}  # the random start's seed, or None for the pretrained one -> losses
        self._pretrained = None

    def pretrained(self, model) -> list:
        """The pretrained start adapted (once)."""
        if self._pretrained is None:
            self._pretrained = self.adapt(model, None)
        return self._pretrained

    def adapt(self, model, seed: int | None) -> list:
        """The backbone weights of `model` (a masked LM) adapted; its losses kept under
        `seed` (None: the pretrained start)."""
        weights, self.measured[seed] = adaptation.adapt(
            model, self.sequences, self.steps, self.batch_size, self.seed
        )
        return weights

    def losses(self, random: bool) -> list:
        """[{"seed", "loss_before", "loss_after"}] of the random starts adapted so far, or
        of the pretrained start (seed None)."""
        seeds = sorted(s for s in self.measured if (s is not None) == random)  # [None], or ints
        return [{"seed": seed, **self.measured[seed]} for seed in seeds]


def random_start(model, adapted: Adaptation | None, seed: int) -> list:
    """The random start of `seed` (of `model`'s shape), adapted when `adapted` is given."""
    if adapted is None:
        return backbone_weights(build_model(model.kroberta_config.model, seed=RANDOM_SEEDS + seed))
    fresh = build_model(
        model.kroberta_config.model,
        seed=RANDOM_SEEDS + seed,
        config=model.kroberta_config,
        tokenizer=model.tokenizer,
    )
    return adapted.adapt(fresh, seed)


def pretrained_start(
    model, start: list, options: FinetuneConfig, adapted: Adaptation | None, seed: int
) -> list:
    """`start` (the model's body), adapted when `adapted` is given, its top
    `options.reinit_layers` layers drawn as the random start of `seed` draws them."""
    if adapted is not None:
        start = adapted.pretrained(model)
    if options.reinit_layers:
        start = reinitialised(model, start, options.reinit_layers, seed)
    return start


def top_layer_indices(backbone, layers: int) -> list:
    """The indices in `backbone.get_weights()` of the top `layers` encoder layers' weights."""
    top = [
        ENCODER_LAYER.format(i) for i in range(backbone.num_layers - layers, backbone.num_layers)
    ]
    return [i for i, v in enumerate(backbone.weights) if v.path.startswith(tuple(top))]


def reinitialised(model, start: list, layers: int, seed: int) -> list:
    """`start` with the top `layers` encoder layers' weights of the random start of `seed`."""
    fresh = build_model(model.kroberta_config.model, seed=RANDOM_SEEDS + seed)
    drawn = backbone_weights(fresh)
    chosen = set(top_layer_indices(fresh.backbone, layers))
    return [drawn[i] if i in chosen else w for i, w in enumerate(start)]
