"""Seconds JAX spends tracing, lowering and compiling programs, as `jax.monitoring` reports them.

A log interval's step time must not include a compilation: the first dispatch of a run
compiles, and so can a later one (a last, shorter group of fused steps; an input whose
sharding changed). Timing dispatches on the host cannot tell; JAX's own monitoring
events can: each tracing, lowering and backend compilation reports its duration.
"""

import jax

# The events JAX records for one compilation (jax/_src/dispatch.py); a program served
# from the cache records none of them.
COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


class CompileClock:
    """Adds up compile durations while its `with` block runs (`seconds`)."""

    def __init__(self):
        self.seconds = 0.0

    def _listen(self, event: str, duration: float, **kwargs):
        if event in COMPILE_EVENTS:
            self.seconds += duration

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._listen)
        return False
