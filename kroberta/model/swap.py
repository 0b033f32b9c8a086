"""Changing keras-hub's layers in place, after the model is built.

The fast CPU layers (dropout, layer norm, GELU) keep every variable, config entry
and weight path of the layers they replace, so they are swapped in on the built
model instead of building a different one: saved files stay stock keras-hub.
"""


def inner_layers(model, matches) -> list:
    """Every layer inside `model` (not `model` itself) for which `matches(layer)`."""
    return [
        layer
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if matches(layer)
    ]


def swap_layers(model, matches, swap) -> int:
    """Calls `swap(layer)` for every layer inside `model` (not `model` itself) for
    which `matches(layer)`; returns how many."""
    layers = inner_layers(model, matches)
    for layer in layers:
        swap(layer)
    return len(layers)
