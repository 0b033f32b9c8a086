"""Backend discipline: Keras runs on JAX, TensorFlow is only a CPU input pipeline.

Imported first by `kroberta/__init__.py`, before anything imports keras or tensorflow.
"""

import os
import sys


class BackendError(RuntimeError):
    """Raised when the process is set up for a Keras backend other than JAX."""


def select_jax_backend():
    """Make Keras use JAX; refuse clearly when the user forced another backend.

    Keras reads KERAS_BACKEND once, at its first import, so this must run before
    `import keras` anywhere in the process.
    """
    requested = os.environ.get("KERAS_BACKEND")
    if requested and requested != "jax":
        raise BackendError(
            f"kroberta runs Keras on JAX, but KERAS_BACKEND={requested!r} is set. "
            "Unset it or set KERAS_BACKEND=jax."
        )
    os.environ["KERAS_BACKEND"] = "jax"
    if "keras" in sys.modules:
        import keras

        if keras.backend.backend() != "jax":
            raise BackendError(
                f"keras was imported before kroberta with the {keras.backend.backend()!r} "
                "backend; import kroberta first or set KERAS_BACKEND=jax."
            )


def hide_accelerators_from_tensorflow():
    """Keep TensorFlow on the host CPU so it never competes with JAX for a GPU/TPU.

    keras-hub pulls in the full `tensorflow` package (through tensorflow-text), which
    would otherwise grab every GPU's memory or try to own a TPU at its first op.
    """
    from kroberta import quiet_start

    # Stops TF's TPU discovery and its GPU memory pre-allocation at the source.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Before TF imports keras, which imports JAX: JAX reads JAX_PLATFORMS on import.
    quiet_start.skip_absent_accelerators()
    with quiet_start.filtered_native_stderr():  # TF's CUDA-stub lines at import and first query
        import tensorflow as tf

        _hide_from_tensorflow(tf)


def _hide_from_tensorflow(tf):
    for kind in ("GPU", "TPU"):
        try:
            tf.config.set_visible_devices([], kind)
        except (RuntimeError, ValueError):
            # RuntimeError: TF already initialised its devices (someone ran a TF op
            # first); ValueError: no such device type in this TF build.
            visible = tf.config.get_visible_devices(kind) if kind == "GPU" else []
            if visible:
                raise BackendError(
                    "TensorFlow was initialised before kroberta and holds "
                    f"{len(visible)} {kind}(s); import kroberta before running any TF op."
                )
