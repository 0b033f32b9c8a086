"""The plan: every setting derived from a config and the devices it runs on, resolved once.

Training, prediction, ahead-of-time compilation and the advisors read their batch
sizes, steps per dispatch, prediction slots and masking from one `Plan` instead of
each working them out again:

    micro batch    batch_size_per_device x devices        (one forward/backward pass)
    global batch   micro batch x gradient_accumulation_steps   (one optimizer step)
    process batch  the rows of a global batch one process reads and feeds
                   (batch_size_per_device x its devices x accumulation)
    steps per dispatch   train.steps_per_execution, "auto" resolved by
                   `kroberta.perf.dispatch_size` for the global batch on these devices
    slots          `data.prediction_slots(sequence_length)`
"""

import dataclasses

from kroberta.config import AUTO, Config
from kroberta.parallel import distribute


@dataclasses.dataclass(frozen=True)
class Plan:
    """What `config` runs as on `topology` (see the module docstring)."""

    config: Config  # train.steps_per_execution an integer
    topology: distribute.Topology
    sequence_length: int
    micro_batch: int
    global_batch: int
    process_batch: int
    steps_per_dispatch: int
    slots: int
    masking: str  # data.masking: "dynamic", "static" ("auto" until files decide it)
    step_input: str | None  # the x entry the training step masks from (DataConfig.step_input)
    needs_word_starts: bool  # whole-word masking: the step holds the tokenizer's table
    auto_steps: bool = False  # train.steps_per_execution was "auto"
    steps_reason: str = ""  # why "auto" chose `steps_per_dispatch` ("" when it was given)

    @property
    def devices(self) -> tuple:
        return self.topology.devices

    @property
    def num_devices(self) -> int:
        return self.topology.num_devices

    @property
    def mesh_shape(self) -> dict:
        return self.topology.mesh_shape

    @property
    def data_shard(self) -> tuple[int, int] | None:
        """(shards, index) of the input this process reads; None for a single process."""
        return distribute.data_shard(self.topology)

    def prediction_batch(self, batch_size: int | None = None) -> int:
        """Sequences per prediction step over all devices: `batch_size` (None: the micro
        batch) rounded up so that every device gets the same share."""
        count = self.num_devices
        batch_size = self.micro_batch if batch_size is None else batch_size
        return -(-batch_size // count) * count

    def prediction_group(self, global_batch: int, slots: int, examples: int | None = None) -> int:
        """G, the prediction batches per dispatch of `global_batch` sequences at `slots`:
        for "auto" `kroberta.perf.dispatch_size.prediction_group`; else the steps per
        dispatch, but never more than the batches of `examples` rounded up to a power of
        two (a large model's padding batches are not cheap)."""
        from kroberta.perf import dispatch_size

        if self.auto_steps:
            return dispatch_size.prediction_group(self.config, self.devices, global_batch,
                                                  slots, self.sequence_length)
        return dispatch_size.at_most_needed(self.steps_per_dispatch, examples, global_batch)


def make_plan(config: Config, devices=None, sequence_length: int | None = None,
              topology: distribute.Topology | None = None, strategy: str | None = None) -> Plan:
    """Resolves every derived setting of `config` once.

    Args:
        config: the run's config (validated).
        devices: the devices it runs on; None: this job's devices, the first
            `distributed.devices` of them (0: all). Ignored when `topology` is given.
        sequence_length: tokens per sequence (the files'); None: model.max_sequence_length.
        topology: the topology `distribute.setup` installed, or one described with
            `distribute.topology_for` (e.g. one process over a TPU topology's devices).
        strategy: None: distributed.strategy; "data" for one batch axis over every
            device, as prediction runs (no model axis to check against the devices).

    Returns:
        The `Plan`; its `config` has train.steps_per_execution resolved.
    """
    from kroberta.perf import dispatch_size

    if topology is None:
        topology = distribute.topology_for(
            config, _selected(config) if devices is None else devices, strategy)
    t, data = config.train, config.data
    length = sequence_length or config.model.max_sequence_length
    micro = t.batch_size_per_device * topology.num_devices
    global_batch = micro * t.gradient_accumulation_steps
    steps, why = t.steps_per_execution, ""
    if steps == AUTO:
        steps, why = dispatch_size.steps_for(config, topology.devices, global_batch, length)
        config = dataclasses.replace(config, train=dataclasses.replace(t, steps_per_execution=steps))
    return Plan(
        config=config, topology=topology, sequence_length=length, micro_batch=micro,
        global_batch=global_batch,
        process_batch=t.batch_size_per_device * topology.local_device_count
        * t.gradient_accumulation_steps,
        steps_per_dispatch=steps, slots=data.prediction_slots(length), masking=data.masking,
        step_input=data.step_input(),
        needs_word_starts=data.whole_word_masking and data.masks_drawn_by_step(),
        auto_steps=bool(why), steps_reason=why)


def _selected(config: Config) -> tuple:
    """This job's devices ordered by process, the first `distributed.devices` (0: all)."""
    import jax

    available = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return tuple(available[: config.distributed.devices or len(available)])
