"""kroberta: pretrain RoBERTa masked-language models on Keras 3 + JAX.

The import order matters: the backend is fixed before keras is imported and
TensorFlow is confined to the CPU before it can touch an accelerator.
"""

import sys

from kroberta import _backend, cpu_collectives, xla_cpu

# Before anything starts JAX's backends: XLA reads XLA_FLAGS once per process.
xla_cpu.use_eigen_dots()
cpu_collectives.use_patient_collectives()

try:
    _backend.select_jax_backend()
    _backend.hide_accelerators_from_tensorflow()
except _backend.BackendError as _error:
    if sys.argv and sys.argv[0] == "-m":
        # `python -m kroberta.<tool>`: Python is importing this package to find the
        # tool, so there is no caller to hand the exception to; say it in one line.
        print(f"error: {_error}", file=sys.stderr)
        sys.exit(2)
    raise

__version__ = "0.1.0"


def __getattr__(name):
    # The public API is loaded lazily so `import kroberta` stays cheap for tools
    # that only need the config or the data pipeline.
    if name in ("load", "save"):
        from kroberta import checkpoint_io

        return getattr(checkpoint_io, name)
    if name in ("predict", "predict_batches"):
        from kroberta import prediction

        return getattr(prediction, name)
    if name == "fill_mask":
        from kroberta.filling import fill_mask

        return fill_mask
    if name in ("export_hf", "from_hf"):
        from kroberta import hf

        return getattr(hf, name)
    raise AttributeError(f"module 'kroberta' has no attribute {name!r}")


__all__ = ["load", "predict", "predict_batches", "fill_mask", "export_hf", "from_hf"]
