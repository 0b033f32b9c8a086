"""Tensor-level mapping between keras-hub's `RobertaMaskedLM` / `RobertaTextClassifier`
and HF's `RobertaForMaskedLM` / `RobertaForSequenceClassification` (one backbone table).

Pure numpy: no torch is needed to convert either way. `hf.py` wraps this with the
config, the files and the tokenizer.

Layouts (keras-hub on the left, torch on the right):
    Dense kernel                (in, out)               Linear weight (out, in)
    attention q/k/v kernel      (hidden, heads, head)   (heads * head, hidden)
    attention q/k/v bias        (heads, head)           (heads * head,)
    attention output kernel     (heads, head, hidden)   (hidden, heads * head)
    position table              (L, hidden)             (L + 2, hidden): HF positions
        start at padding_idx + 1 = 2, so rows 0-1 are never read (we write zeros).
HF also adds token_type_embeddings[0] to every token; keras-hub has no token-type
table, so on import that row is folded into the position table (exact in HF's
arithmetic up to float rounding), and on export the row is zeros.
"""

import numpy as np

from kroberta.errors import ConversionError

# HF RoBERTa position ids are cumsum(non-pad) + padding_idx, padding_idx = 1.
POSITION_OFFSET = 2
# The model keys that fix the weights' shapes, and how HF's config.json names each model
# key (keras-hub's names are kroberta's).
SHAPE_KEYS = (
    "vocabulary_size",
    "num_layers",
    "num_heads",
    "hidden_dim",
    "intermediate_dim",
    "max_sequence_length",
)
HF_NAMES = {
    "vocabulary_size": "vocab_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "hidden_dim": "hidden_size",
    "intermediate_dim": "intermediate_size",
    "max_sequence_length": "max_position_embeddings",
    "dropout": "hidden_dropout_prob",
    "attention_dropout": "attention_probs_dropout_prob",
    "initializer_range": "initializer_range",
    "layer_norm_epsilon": "layer_norm_eps",
}

WORD_EMBEDDINGS = "roberta.embeddings.word_embeddings.weight"
POSITION_EMBEDDINGS = "roberta.embeddings.position_embeddings.weight"
TOKEN_TYPE_EMBEDDINGS = "roberta.embeddings.token_type_embeddings.weight"
LM_HEAD_BIAS = "lm_head.bias"
# Older checkpoints store the output bias (and the tied decoder) under these names.
LM_HEAD_DECODER_BIAS = "lm_head.decoder.bias"
LM_HEAD_DECODER_WEIGHT = "lm_head.decoder.weight"


def _to_hf(kind: str, x: np.ndarray) -> np.ndarray:
    if kind == "linear":  # (in, out) -> (out, in)
        return x.T
    if kind == "qkv":  # (hidden, heads, head) -> (heads * head, hidden)
        return x.reshape(x.shape[0], -1).T
    if kind == "qkv_bias":  # (heads, head) -> (heads * head,)
        return x.reshape(-1)
    if kind == "attn_out":  # (heads, head, hidden) -> (hidden, heads * head)
        return x.reshape(-1, x.shape[2]).T
    return x  # "copy"


def _from_hf(kind: str, t: np.ndarray, shape: tuple) -> np.ndarray:
    # `_to_hf` undone: torch's (out, in) transposed back, then keras-hub's shape.
    return (t if kind in ("copy", "qkv_bias") else t.T).reshape(shape)


def is_classifier(model) -> bool:
    """Whether `model` is keras-hub's `RobertaTextClassifier` (else a masked LM)."""
    # start-up: the weight names are read without Keras; keras-hub loads to ask of a model
    import keras_hub

    return isinstance(model, keras_hub.models.RobertaTextClassifier)


def check_first_token_head(classifier, where: str, head: str):
    """Refuses a classifier whose head does not read the first token (`<s>`), as `head`
    (the other library's classifier) does: its export would predict differently."""
    pooling = getattr(classifier, "pooling", "first")
    if pooling != "first":
        raise ConversionError(
            f"{where}: this classifier's head reads the {pooling} of its tokens "
            f"(pooling={pooling!r}), but {head} reads the first token (<s>) only, so the "
            f"export would predict differently; fine-tune with pooling='first' (--pooling "
            f"first) to export, or keep this one in kroberta (--out, kroberta.load, "
            f"kroberta.predict)"
        )


def weight_specs(model) -> list[tuple[str, object, str]]:
    """(HF tensor name, Keras variable, layout kind) for every weight but the position
    table: the backbone's, then the masked LM's or the classifier's head."""
    if is_classifier(model):
        # HF `RobertaClassificationHead` <-> keras-hub's `RobertaTextClassifier` head: both
        # take the <s> token's state (index 0), dropout -> dense -> tanh -> dropout -> output
        # projection; keras-hub's `pooled_dense` carries the tanh as its activation.
        return backbone_specs(model.backbone) + [
            ("classifier.dense.weight", model.pooled_dense.kernel, "linear"),
            ("classifier.dense.bias", model.pooled_dense.bias, "copy"),
            ("classifier.out_proj.weight", model.output_dense.kernel, "linear"),
            ("classifier.out_proj.bias", model.output_dense.bias, "copy"),
        ]
    head = model.masked_lm_head
    return backbone_specs(model.backbone) + [
        # HF lm_head: dense -> gelu -> layer_norm -> decoder (tied) + bias, as keras-hub's head.
        ("lm_head.dense.weight", head._intermediate_dense.kernel, "linear"),
        ("lm_head.dense.bias", head._intermediate_dense.bias, "copy"),
        ("lm_head.layer_norm.weight", head._intermediate_layer_norm.gamma, "copy"),
        ("lm_head.layer_norm.bias", head._intermediate_layer_norm.beta, "copy"),
        (LM_HEAD_BIAS, head._bias, "copy"),
    ]


def backbone_specs(backbone) -> list[tuple[str, object, str]]:
    """The specs of a `RobertaBackbone`'s weights but the position table (HF's `roberta.*`)."""
    specs = [
        (WORD_EMBEDDINGS, backbone.token_embedding.embeddings, "copy"),
        ("roberta.embeddings.LayerNorm.weight", backbone.embeddings_layer_norm.gamma, "copy"),
        ("roberta.embeddings.LayerNorm.bias", backbone.embeddings_layer_norm.beta, "copy"),
    ]
    for i, layer in enumerate(backbone.transformer_layers):
        p = f"roberta.encoder.layer.{i}"
        attention = layer._self_attention_layer
        for hf_name, dense in (
            ("self.query", attention.query_dense),
            ("self.key", attention.key_dense),
            ("self.value", attention.value_dense),
        ):
            specs.append((f"{p}.attention.{hf_name}.weight", dense.kernel, "qkv"))
            specs.append((f"{p}.attention.{hf_name}.bias", dense.bias, "qkv_bias"))
        specs += [
            (f"{p}.attention.output.dense.weight", attention.output_dense.kernel, "attn_out"),
            (f"{p}.attention.output.dense.bias", attention.output_dense.bias, "copy"),
            (
                f"{p}.attention.output.LayerNorm.weight",
                layer._self_attention_layer_norm.gamma,
                "copy",
            ),
            (f"{p}.attention.output.LayerNorm.bias", layer._self_attention_layer_norm.beta, "copy"),
            (
                f"{p}.intermediate.dense.weight",
                layer._feedforward_intermediate_dense.kernel,
                "linear",
            ),
            (f"{p}.intermediate.dense.bias", layer._feedforward_intermediate_dense.bias, "copy"),
            (f"{p}.output.dense.weight", layer._feedforward_output_dense.kernel, "linear"),
            (f"{p}.output.dense.bias", layer._feedforward_output_dense.bias, "copy"),
            (f"{p}.output.LayerNorm.weight", layer._feedforward_layer_norm.gamma, "copy"),
            (f"{p}.output.LayerNorm.bias", layer._feedforward_layer_norm.beta, "copy"),
        ]
    return specs


def _position_variable(model):
    return model.backbone.embeddings.position_embedding.position_embeddings


def _numpy(variable) -> np.ndarray:
    return np.asarray(variable.value, dtype=np.float32)


def to_hf_tensors(model) -> dict[str, np.ndarray]:
    """All tensors of `RobertaForMaskedLM`'s state dict (float32, C-contiguous), decoder
    omitted, or of `RobertaForSequenceClassification`'s for a classifier.

    The decoder weight and bias are tied to the word embeddings and `lm_head.bias`;
    transformers' own `save_pretrained` omits them too and reports no missing keys.
    """
    tensors = {name: _to_hf(kind, _numpy(var)) for name, var, kind in weight_specs(model)}
    positions = _numpy(_position_variable(model))  # (L, hidden)
    hidden = positions.shape[1]
    tensors[POSITION_EMBEDDINGS] = np.concatenate(
        [np.zeros((POSITION_OFFSET, hidden), np.float32), positions]
    )  # (L + 2, hidden)
    tensors[TOKEN_TYPE_EMBEDDINGS] = np.zeros((1, hidden), np.float32)
    return {name: np.ascontiguousarray(t, dtype=np.float32) for name, t in tensors.items()}


def load_hf_tensors(model, tensors: dict, source: str, tied: bool = True):
    """Assigns HF tensors to `model`'s variables; checks names and shapes before assigning any.

    Args:
        model: a keras-hub `RobertaMaskedLM` of the checkpoint's shape.
        tensors: name -> array (numpy), as in a `RobertaForMaskedLM` state dict.
        source: the checkpoint's path, named in errors.
        tied: the checkpoint's `tie_word_embeddings`; an untied decoder is accepted
            only when it equals the word embeddings (kroberta's head is tied).
    """
    tensors = dict(tensors)
    if LM_HEAD_BIAS not in tensors and LM_HEAD_DECODER_BIAS in tensors:
        tensors[LM_HEAD_BIAS] = tensors[LM_HEAD_DECODER_BIAS]
    specs = weight_specs(model)
    # The layouts' shapes, from `_to_hf` itself on a zero-stride array (no memory).
    shapes = {
        name: _to_hf(kind, np.broadcast_to(np.float32(0), tuple(var.shape))).shape
        for name, var, kind in specs
    }
    length, hidden = tuple(_position_variable(model).shape)
    shapes[POSITION_EMBEDDINGS] = (length + POSITION_OFFSET, hidden)
    missing = [name for name in shapes if name not in tensors]
    if missing:
        raise ConversionError(f"{source}: missing tensor(s): {', '.join(missing)}")
    for name, expected in shapes.items():
        if tuple(tensors[name].shape) != expected:
            raise ConversionError(
                f"{source}: tensor {name}: expected shape {expected}, "
                f"got {tuple(tensors[name].shape)}"
            )
    token_type = tensors.get(TOKEN_TYPE_EMBEDDINGS)
    if token_type is not None and (
        token_type.ndim != 2 or token_type.shape[0] < 1 or token_type.shape[1] != hidden
    ):
        raise ConversionError(
            f"{source}: tensor {TOKEN_TYPE_EMBEDDINGS}: expected shape "
            f"(type_vocab_size, {hidden}), got {tuple(token_type.shape)}"
        )
    if not tied and LM_HEAD_DECODER_WEIGHT in tensors:
        if not np.array_equal(
            np.asarray(tensors[LM_HEAD_DECODER_WEIGHT]), np.asarray(tensors[WORD_EMBEDDINGS])
        ):
            raise ConversionError(
                f"{source}: tie_word_embeddings is false and {LM_HEAD_DECODER_WEIGHT} differs from "
                f"{WORD_EMBEDDINGS}; kroberta's MLM head is tied to the token embedding"
            )

    values = [
        (var, _from_hf(kind, np.asarray(tensors[name], np.float32), tuple(var.shape)))
        for name, var, kind in specs
    ]
    positions = np.asarray(tensors[POSITION_EMBEDDINGS], np.float32)[
        POSITION_OFFSET:
    ]  # (L, hidden)
    if token_type is not None:
        # HF adds token_type_embeddings[token_type_ids] to every token and MLM inputs use
        # type 0 only, so row 0 is a constant offset; rows 1+ (type_vocab_size > 1) are
        # never used by RoBERTa's MLM and are ignored.
        positions = positions + np.asarray(token_type, np.float32)[0]
    values.append((_position_variable(model), positions))
    for var, value in values:
        var.assign(value.astype(np.float32))
