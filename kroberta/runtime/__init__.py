"""The process: Keras on JAX, TensorFlow on the CPU, XLA's CPU flags, a quiet start."""
