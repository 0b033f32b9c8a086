"""Model FLOPs, parameters and memory, counted analytically from the config.

Only matrix multiplications are counted (2 FLOPs per multiply-add), the usual
convention for MFU: layer norms, softmax, GELU, dropout and the optimizer update
are left out, so XLA's own count (`cost_analysis()`) is ~5-15% higher. For one
sequence of L tokens, per encoder layer (hidden H, intermediate I):

    Q, K, V projections     3 * 2*L*H*H
    attention output        2*L*H*H
    feed-forward            2 * 2*L*H*I
    scores  Q K^T           2*L*L*H      (all heads together: heads * head_dim = H)
    values  softmax(.) V    2*L*L*H

and the sparse MLM head at the M predicted positions only (vocabulary V):

    dense + layer norm      2*M*H*H
    tied vocab projection   2*M*H*V

Training (forward + backward) is 3x the forward: the backward pass computes
gradients with respect to both the inputs and the weights of every matmul.
"""

import dataclasses

from kroberta.config import Config, ModelConfig

TRAIN_TO_FORWARD = 3


@dataclasses.dataclass(frozen=True)
class Shape:
    """The dimensions FLOPs depend on (the model config plus the data's L and M)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    vocabulary: int
    length: int  # L, tokens per sequence
    slots: int  # M, predicted positions per sequence

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @classmethod
    def from_config(cls, config: Config, length: int | None = None, slots: int | None = None):
        m = config.model
        length = length or m.max_sequence_length
        slots = slots or config.data.prediction_slots(length)
        return cls(
            m.num_layers,
            m.hidden_dim,
            m.intermediate_dim,
            m.num_heads,
            m.vocabulary_size,
            length,
            slots,
        )


def forward_breakdown(shape: Shape, projections: int | None = None) -> dict[str, int]:
    """Forward matmul FLOPs of one sequence, by component. `projections`: the width of
    Q, K, V and the attention output's input, heads x head_dim (None: the hidden size;
    the advisor pads the head size)."""
    n, h, i, v, L, M = (
        shape.layers,
        shape.hidden,
        shape.intermediate,
        shape.vocabulary,
        shape.length,
        shape.slots,
    )
    p = projections or h
    return {
        "qkv": n * 3 * 2 * L * h * p,
        "attention_output": n * 2 * L * p * h,
        "feed_forward": n * 2 * 2 * L * h * i,
        "attention_scores": n * 2 * L * L * p,
        "attention_values": n * 2 * L * L * p,
        "head_dense": 2 * M * h * h,
        "head_vocabulary": 2 * M * h * v,
    }


def forward_flops_per_sequence(shape: Shape) -> int:
    return sum(forward_breakdown(shape).values())


def train_flops_per_sequence(shape: Shape) -> int:
    return TRAIN_TO_FORWARD * forward_flops_per_sequence(shape)


def flops_per_token(shape: Shape, train: bool = True) -> float:
    per_sequence = train_flops_per_sequence(shape) if train else forward_flops_per_sequence(shape)
    return per_sequence / shape.length


def train_flops_per_step(shape: Shape, global_batch: int) -> int:
    return global_batch * train_flops_per_sequence(shape)


def parameter_count(model: ModelConfig) -> int:
    """Trainable parameters of keras-hub's RobertaBackbone + the tied MaskedLMHead."""
    h, i, v = model.hidden_dim, model.intermediate_dim, model.vocabulary_size
    embeddings = v * h + model.max_sequence_length * h + 2 * h  # tokens, positions, layer norm
    per_layer = (
        4 * (h * h + h)  # Q, K, V, output projections with biases
        + 2 * 2 * h  # two layer norms
        + (h * i + i)
        + (i * h + h)  # feed-forward
    )
    head = (h * h + h) + 2 * h + v  # dense, layer norm, vocabulary bias (kernel tied)
    return embeddings + model.num_layers * per_layer + head


@dataclasses.dataclass(frozen=True)
class Memory:
    """Bytes per device under data parallelism (weights replicated)."""

    parameters: int
    gradients: int
    optimizer: int
    activations: int  # rough: what the backward pass keeps, per device's batch

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations


def memory_estimate(
    shape: Shape, parameters: int, batch_per_device: int, mixed_precision: bool = False
) -> Memory:
    """float32 weights, gradients and AdamW's two moments; activations roughly.

    The activation term counts, per layer and token, the tensors the backward pass
    keeps (inputs of the 6 projections, Q/K/V, FFN input and GELU output, norms,
    dropout masks ~ 16 H + 3 I values) plus per head the L x L scores and
    probabilities, and the head's (M, V) logits and their gradient in float32.
    """
    act_bytes = 2 if mixed_precision else 4
    L, h = shape.length, shape.hidden
    per_sequence = (
        shape.layers * (L * (16 * h + 3 * shape.intermediate) + 3 * shape.heads * L * L) * act_bytes
    )
    per_sequence += 3 * shape.slots * shape.vocabulary * 4 + L * h * act_bytes * 2
    return Memory(
        parameters=4 * parameters,
        gradients=4 * parameters,
        optimizer=2 * 4 * parameters,
        activations=batch_per_device * per_sequence,
    )
