"""The fine-tuning recipe's optional steps, each off by default (and then changing nothing).

    probe_epochs   LP-FT (Kumar et al. 2022): the head alone first, the body frozen
    layer_decay    layer-wise learning-rate decay (ELECTRA, Clark et al. 2020)
    adapt_steps    task-adaptive pretraining (TAPT, Gururangan et al. 2020): masked-LM
                   steps on the task's own training texts before fine-tuning
    reinit_layers  the top layers drawn afresh before fine-tuning (Zhang et al. 2021)

The values are checked at the boundary (`arguments.check_recipe_options`); the ones
switched on are part of a trial's settings (`TrialLog`), so a resumed fine-tune never
reuses trials made without them, and all four are recorded in the result.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class RecipeOptions:
    """The optional steps of a fine-tune (see the module); the defaults are off.

    Attributes:
        probe_epochs: epochs training only the classifier's head, the body frozen
            (`layer.trainable = False`), before `epochs` of training everything.
        layer_decay: D in (0, 1]: the head and the top encoder layer learn at the trial's
            rate, each layer below at D times the one above, the embeddings at D^L.
        adapt_steps: masked-LM steps on the training texts before fine-tuning.
        reinit_layers: the top K encoder layers of the pretrained start re-initialised.
    """

    probe_epochs: int = 0
    layer_decay: float = 1.0
    adapt_steps: int = 0
    reinit_layers: int = 0

    def switched_on(self) -> dict:
        """{name: value} of the options that are not off (a trial's settings)."""
        off = RecipeOptions()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(off, f.name)}

    def to_json(self) -> dict:
        """All four, as JSON values (the result's record)."""
        return dataclasses.asdict(self)
