"""The learning rates a fine-tune accepts, checked before any work (no JAX or Keras here).

A rate above 1 or below 1e-8 is a typo (`3e4` for `3e-4`) that would diverge, or
learn nothing, after minutes of work: refused, naming the rate likely meant.
"""

from kroberta.errors import InputError

LOWEST, HIGHEST = 1e-8, 1.0
FACTOR = 3.0  # a grid widens by this factor at its edge


def _likely_meant(rate: float) -> str:
    """ '; did you mean 3e-4?' for 3e4 (the exponent's sign left out), else ''."""
    mantissa, exponent = f"{rate:e}".split("e")
    if int(exponent) > 0:
        flipped = float(f"{mantissa}e-{int(exponent)}")
        if LOWEST <= flipped <= HIGHEST:
            return f"; did you mean {flipped:g}?"
    return ""


def check(rates, option: str = "--learning-rates") -> tuple:
    """`rates` as a tuple of floats; an InputError naming `option` for an empty grid or
    a rate outside LOWEST..HIGHEST."""
    rates = tuple(float(r) for r in rates)
    if not rates:
        raise InputError(f"{option}: expected at least one learning rate")
    for rate in rates:
        if not LOWEST <= rate <= HIGHEST:
            raise InputError(f"{option} {rate:g}: outside {LOWEST:g} to {HIGHEST:g} (fine-tuning "
                             "uses about 1e-5 for large models to 3e-3 for small ones)"
                             f"{_likely_meant(rate)}")
    return rates


def parse(text: str | None, option: str = "--learning-rates") -> tuple | None:
    """A comma-separated grid from the command line (None: the default grid)."""
    if not text:
        return None
    try:
        values = [float(r) for r in text.split(",")]
    except ValueError:
        raise InputError(f"{option} {text!r}: expected numbers separated by commas, "
                         "e.g. 1e-5,3e-5") from None
    return check(values, option)


def next_rate(rate: float, upward: bool) -> float:
    """The rate a factor of 3 up or down, at three significant digits (3e-4 -> 9e-4)."""
    return float(f"{rate * FACTOR if upward else rate / FACTOR:.3g}")
