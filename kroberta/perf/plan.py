"""The plan: every setting derived from a config and the devices it runs on, resolved once.

Training, prediction, ahead-of-time compilation and the advisors read their batch
sizes, steps per dispatch and prediction slots from one `Plan` instead of each
working them out again:

    micro batch    batch_size_per_device x devices        (one forward/backward pass)
    global batch   micro batch x gradient_accumulation_steps   (one optimizer step)
    process batch  the rows of a global batch one process reads and feeds
                   (batch_size_per_device x its devices x accumulation)
    steps per dispatch   train.steps_per_execution, "auto" resolved by
                   `kroberta.perf.dispatch_size` for the global batch on these devices
    slots          `data.prediction_slots(sequence_length)`

What the devices' peak FLOP/s decides ("auto" steps per dispatch, prediction groups)
is resolved when first read, the peak looked up once per plan.
"""

import dataclasses
import functools

import jax

from kroberta.config import AUTO, Config
from kroberta.parallel import distribute
from kroberta.perf import dispatch_size, throughput


@dataclasses.dataclass(frozen=True)
class Plan:
    """What `requested` runs as on `topology` (see the module docstring)."""

    requested: Config  # as given: train.steps_per_execution may be "auto"
    topology: distribute.Topology
    sequence_length: int
    micro_batch: int
    global_batch: int
    process_batch: int
    slots: int

    @property
    def data_shard(self) -> tuple[int, int] | None:
        """(shards, index) of the input this process reads; None for a single process."""
        t = self.topology
        return None if t.process_count == 1 else (t.process_count, t.process_index)

    @functools.cached_property
    def peak_flops(self) -> float | None:
        """The devices' peak FLOP/s together (`kroberta.perf.throughput`); None if unknown."""
        return throughput.peak_flops(self.topology.devices)

    @functools.cached_property
    def _steps(self) -> tuple[int, str]:
        steps = self.requested.train.steps_per_execution
        if steps != AUTO:
            return steps, ""
        return dispatch_size.steps_for(
            self.requested, self.peak_flops, self.global_batch, self.sequence_length
        )

    @property
    def steps_per_dispatch(self) -> int:
        return self._steps[0]

    @property
    def auto_steps(self) -> bool:
        """Whether train.steps_per_execution was "auto"."""
        return self.requested.train.steps_per_execution == AUTO

    @property
    def steps_reason(self) -> str:
        """Why "auto" chose `steps_per_dispatch` ("" when it was given)."""
        return self._steps[1]

    @functools.cached_property
    def config(self) -> Config:
        """`requested` with train.steps_per_execution an integer."""
        if not self.auto_steps:
            return self.requested
        return self.requested.with_section("train", steps_per_execution=self.steps_per_dispatch)

    def prediction_batch(self, batch_size: int | None = None) -> int:
        """Sequences per prediction step over all devices: `batch_size` (None: the micro
        batch) rounded up so that every device gets the same share."""
        count = self.topology.num_devices
        batch_size = self.micro_batch if batch_size is None else batch_size
        return -(-batch_size // count) * count

    def prediction_group(self, global_batch: int, slots: int, examples: int | None = None) -> int:
        """G, the prediction batches per dispatch of `global_batch` sequences at `slots`:
        for "auto" `kroberta.perf.dispatch_size.prediction_group`; else the steps per
        dispatch, but never more than the batches of `examples` rounded up to a power of
        two (a large model's padding batches are not cheap)."""
        if self.auto_steps:
            return dispatch_size.prediction_group(
                self.requested, self.peak_flops, global_batch, slots, self.sequence_length
            )
        return dispatch_size.at_most_needed(self.steps_per_dispatch, examples, global_batch)


def make_plan(
    config: Config,
    devices=None,
    sequence_length: int | None = None,
    topology: distribute.Topology | None = None,
    strategy: str | None = None,
) -> Plan:
    """Resolves every derived setting of `config` once.

    Args:
        config: the run's config (validated).
        devices: the devices it runs on; None: this job's (`distribute.select_devices`).
            Ignored when `topology` is given.
        sequence_length: tokens per sequence (the files'); None: model.max_sequence_length.
        topology: the topology `distribute.setup` installed, or one described with
            `distribute.topology_for` (e.g. one process over a TPU topology's devices).
        strategy: None: distributed.strategy; "data" for one batch axis over every
            device, as prediction runs (no model axis to check against the devices).

    Returns:
        The `Plan`; its `config` has train.steps_per_execution resolved.
    """
    if topology is None:
        if devices is None:
            devices = distribute.select_devices(config.distributed)
        topology = distribute.topology_for(config.distributed, config.model, devices, strategy)
    t = config.train
    length = sequence_length or config.model.max_sequence_length
    micro = t.batch_size_per_device * topology.num_devices
    return Plan(
        requested=config,
        topology=topology,
        sequence_length=length,
        micro_batch=micro,
        global_batch=micro * t.gradient_accumulation_steps,
        process_batch=t.batch_size_per_device
        * topology.local_device_count
        * t.gradient_accumulation_steps,
        slots=config.data.prediction_slots(length),
    )


def for_local_devices(config: Config) -> Config:
    """`config` with "auto" steps per dispatch resolved for every local device in one batch
    axis: for a model compiled outside a run, whose mesh is not known (a run compiles
    with its own plan's `config`)."""
    return make_plan(config, jax.devices(), strategy="data").config
