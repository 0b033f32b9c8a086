"""K steps as one program: a `lax.scan` of a step over a (K, batch, ...) super-batch.

What `fit` runs for train.steps_per_execution = K on every Keras line (Keras >= 3.16
builds the same scan itself; on 3.15 `kroberta.model.fused_steps` does), and what the
ahead-of-time programs (`kroberta.perf.aot_programs`) and `tools/bench_overhead.py`
lower and time.
"""

import jax


def scan_steps(step):
    """`step(state, batch) -> (logs, state)` made into `(state, super_batch) -> (logs, state)`:
    a `lax.scan` over the super-batch's leading axis (K). The logs are the last step's
    (Keras' metrics results, which cover all K steps)."""

    def run(state, super_batch):
        def body(carry, batch):
            logs, carry = step(carry, batch)
            return carry, logs

        state, logs = jax.lax.scan(body, state, super_batch)
        return jax.tree.map(lambda v: v[-1], logs), state

    return run


def super_batch_sharding(distribution, shape):
    """Where a (K, batch, ...) leaf goes: the distribution's layout of one step's
    (batch, ...) array, with the K axis unsplit in front."""
    layout = distribution.get_data_layout(tuple(shape[1:])).backend_layout
    spec = jax.sharding.PartitionSpec(None, *layout.spec)
    return jax.sharding.NamedSharding(layout.mesh, spec)
