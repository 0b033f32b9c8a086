"""`FinetuneConfig`: every setting of a fine-tune and its default, checked once.

The one place of fine-tuning's settings, as `kroberta.config.Config` is pretraining's:
`kroberta.finetune(model, ..., config=FinetuneConfig(epochs=5))` takes it, and
`python -m kroberta.finetune` builds it from its flags (whose defaults are the fields'
below). It holds neither the model nor the data (the task, its files and fields, and
`--out` are `finetune`'s own arguments). This module imports no JAX, Keras or TensorFlow,
so a setting no fine-tune can run with is refused before they load.

A refused setting is a `SettingError`: its message names the keyword (`epochs=0: ...`);
the command line names the flag instead (`--epochs 0: ...`, `SettingError.flag_message`).

The recipe's four optional steps (`RECIPE_OPTIONS`: LP-FT, Kumar et al. 2022; layer-wise
learning-rate decay, ELECTRA; task-adaptive pretraining, Gururangan et al. 2020; the top
layers drawn afresh, Zhang et al. 2021) are off by default, and then change nothing; the
ones switched on are part of a trial's settings (`TrialLog`), so a resumed fine-tune never
reuses trials made without them.
"""

import dataclasses
import numbers
from collections.abc import Iterable

from kroberta.downstream.encoding import MIN_LENGTH
from kroberta.errors import InputError

FIRST, MEAN = "first", "mean"
POOLINGS = (FIRST, MEAN)  # what the head reads: the `<s>` state, or the tokens' mean
RECIPE_OPTIONS = ("probe_epochs", "layer_decay", "adapt_steps", "reinit_layers")
LOWEST, HIGHEST = 1e-8, 1.0


def _likely_meant(rate: float) -> str:
    """'; did you mean 3e-4?' for 3e4 (the exponent's sign left out), else ''."""
    mantissa, exponent = f"{rate:e}".split("e")
    if int(exponent) > 0:
        flipped = float(f"{mantissa}e-{int(exponent)}")
        if LOWEST <= flipped <= HIGHEST:
            return f"; did you mean {flipped:g}?"
    return ""


def _number(value) -> bool:
    """Whether `value` is a real number (not a bool, not a string)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_rates(rates, option: str = "--learning-rates") -> tuple:
    """`rates` as a tuple of floats; an InputError naming `option` for an empty grid or
    a rate outside LOWEST..HIGHEST."""
    rates = tuple(float(r) for r in rates)
    if not rates:
        raise InputError(f"{option}: expected at least one learning rate")
    for rate in rates:
        if not LOWEST <= rate <= HIGHEST:
            raise InputError(
                f"{option} {rate:g}: outside {LOWEST:g} to {HIGHEST:g} (fine-tuning "
                "uses about 1e-5 for large models to 3e-3 for small ones)"
                f"{_likely_meant(rate)}"
            )
    return rates


def parse_rates(text: str | None, option: str = "--learning-rates") -> tuple | None:
    """A comma-separated grid from the command line (None: the default grid)."""
    if not text:
        return None
    try:
        values = [float(r) for r in text.split(",")]
    except ValueError:
        raise InputError(
            f"{option} {text!r}: expected numbers separated by commas, e.g. 1e-5,3e-5"
        ) from None
    return check_rates(values, option)


class SettingError(InputError):
    """A setting no fine-tune can run with: `setting` is its keyword (`FinetuneConfig`'s
    field); the message names it as the keyword, `flag_message` as the command's flag."""

    def __init__(self, setting: str, value: str, problem: str):
        self.setting, self.value, self.problem = setting, value, problem
        super().__init__(f"{setting}={value}: {problem}")

    @property
    def flag_message(self) -> str:
        """The message as `python -m kroberta.finetune` says it: `--epochs 0: ...`."""
        return f"--{self.setting.replace('_', '-')} {self.value}: {self.problem}"


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """The settings of a fine-tune (`kroberta.finetune`); each field is also the flag of
    `python -m kroberta.finetune` with `-` for `_` (`epochs`: `--epochs`).

    Attributes:
        learning_rates: the grid (None: 1e-5, 3e-5, 5e-5 for hidden >= 768, else 3e-4,
            1e-3, 3e-3).
        baseline_learning_rates: the random start's own grid (None: as `learning_rates`).
        widen: while a grid's best rate is at its edge, add the rate 3x beyond it (grids
            of two rates or more); else the next rate to try is said.
        seeds: the number of seeds per learning rate, or the seeds themselves.
        epochs: the most passes over the training data; each trial keeps its best epoch
            (scored after every pass).
        early_stopping: a trial stops after this many epochs without a better score
            (None: it runs every epoch).
        batch_size: sequences per step over all devices (a multiple of their number).
        max_length: tokens per sequence (None, the default, and the cap: the model's
            max_sequence_length).
        pooling: what the classifier's head reads: "first", the `<s>` state (as Hugging
            Face's and keras-hub's heads, exportable to both), or "mean", the mean over
            the tokens that are not padding (not exportable); the random start's too.
        baseline: also run the recipe from a random initialisation (`result.baseline`,
            and `result.comparison`: the difference with its interval).
        probe_epochs: LP-FT: epochs training only the classifier's head, the body frozen,
            before `epochs` of training everything (0: off).
        layer_decay: D in (0, 1]: the head and the top encoder layer learn at the trial's
            rate, each layer below at D times the one above, the embeddings at D^L (1: off).
        adapt_steps: masked-LM steps on the training texts before fine-tuning (0: off).
        reinit_layers: the top K encoder layers of the pretrained start drawn afresh
            (0: off; at most the model's layers, checked once it is loaded).

    Raises:
        SettingError: a setting no fine-tune can run with (names it).
    """

    learning_rates: tuple | None = None
    baseline_learning_rates: tuple | None = None
    widen: bool = True
    seeds: int | tuple = 3
    epochs: int = 3
    early_stopping: int | None = None
    batch_size: int = 32
    max_length: int | None = None
    pooling: str = FIRST
    baseline: bool = False
    probe_epochs: int = 0
    layer_decay: float = 1.0
    adapt_steps: int = 0
    reinit_layers: int = 0

    def __post_init__(self):
        for name in ("learning_rates", "baseline_learning_rates"):
            rates = getattr(self, name)
            if rates is None:
                continue
            # `learning_rates=1e-3` or `"1e-3"`: one number given where a grid is expected.
            grid = isinstance(rates, Iterable) and not isinstance(rates, (str, bytes))
            if not grid or not all(map(_number, rates)):
                raise SettingError(
                    name, repr(rates), "expected a list of learning rates, e.g. [1e-3, 3e-3]"
                )
            # As a tuple of floats: the config is hashable.
            object.__setattr__(self, name, check_rates(rates, name))
        if not (self.seeds >= 1 if _whole(self.seeds) else len(self.seeds)):
            raise SettingError("seeds", self.seeds, "expected at least one seed")
        if not _whole(self.seeds):
            object.__setattr__(self, "seeds", tuple(self.seeds))
        for name, accepted, expected in _CHECKS:
            value = getattr(self, name)
            if not accepted(value):
                # A pooling is a name: quoted, as a string shows in Python.
                raise SettingError(name, repr(value) if name == "pooling" else value, expected)

    def recipe(self) -> dict:
        """The four optional steps' values (the result's record `recipe`)."""
        return {name: getattr(self, name) for name in RECIPE_OPTIONS}

    def recipe_switched_on(self) -> dict:
        """{name: value} of the optional steps that are not off (a trial's settings)."""
        return {
            name: value
            for name, value in self.recipe().items()
            if value != getattr(FinetuneConfig, name)
        }


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _at_least(least: int, optional: bool = False):
    """A test of a whole number of at least `least` (or None, when `optional`)."""
    return lambda value: (optional and value is None) or (_whole(value) and value >= least)


# The settings checked after the grids and seeds, in this order: (setting, the test its
# value must pass, what is expected).
_CHECKS = (
    ("epochs", _at_least(1), "expected a whole number of at least 1"),
    ("early_stopping", _at_least(1, optional=True), "expected a patience of at least 1 epoch"),
    ("batch_size", _at_least(1), "must be a positive multiple of the devices"),
    ("max_length", _at_least(MIN_LENGTH, optional=True), f"expected at least {MIN_LENGTH}"),
    ("pooling", lambda value: value in POOLINGS, f"expected one of {', '.join(POOLINGS)}"),
    (
        "probe_epochs",
        _at_least(0),
        "expected a whole number of epochs (0, the default, trains the head only together "
        "with the body)",
    ),
    (
        "layer_decay",
        lambda d: isinstance(d, (int, float)) and not isinstance(d, bool) and 0 < d <= 1,
        "expected a factor in (0, 1] (1, the default, gives every layer the trial's learning rate)",
    ),
    (
        "adapt_steps",
        _at_least(0),
        "expected a whole number of masked-LM steps (0, the default, adapts nothing)",
    ),
    (
        "reinit_layers",
        _at_least(0),
        "expected a whole number of top layers to re-initialise (0, the default, keeps them all)",
    ),
)
