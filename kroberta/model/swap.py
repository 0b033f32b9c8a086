"""Changing keras-hub's layers in place, after the model is built.

The fast CPU layers (dropout, layer norm, GELU) keep every variable, config entry
and weight path of the layers they replace, so they are swapped in on the built
model instead of building a different one: saved files stay stock keras-hub.
"""


def swap_layers(model, matches, swap) -> int:
    """Calls `swap(layer)` for every layer inside `model` (not `model` itself) for
    which `matches(layer)`; returns how many."""
    switched = 0
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if matches(layer):
            swap(layer)
            switched += 1
    return switched


def to_class(cls):
    """A `swap` that makes a layer an instance of `cls` (a subclass of its own class)."""
    def swap(layer):
        layer.__class__ = cls
    return swap
