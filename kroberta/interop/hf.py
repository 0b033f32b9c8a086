"""Hugging Face interop: export a kroberta model as `RobertaForMaskedLM` (a fine-tuned
classifier as `RobertaForSequenceClassification`), and read one (`kroberta.load` builds it).

An exported directory loads with `transformers.RobertaForMaskedLM.from_pretrained(dir)`
with no missing or unexpected keys, and `AutoTokenizer.from_pretrained(dir)` when a
tokenizer was exported; logits match kroberta's to float32 rounding. Importing reads
`config.json` and `model.safetensors` (or `pytorch_model.bin`, which needs torch),
including the MLM head. The tensor mapping lives in `hf_weights.py`; nothing here
needs torch or transformers.
"""

import dataclasses
import json
import os

import keras
from safetensors import SafetensorError
from safetensors.numpy import load_file, save

from kroberta import storage, tokens
from kroberta.config import FOLLOW_DROPOUT, Config, ModelConfig
from kroberta.errors import ConversionError, InputError, NotFoundError
from kroberta.interop import checked_export, hf_weights, staged_export
from kroberta.model.attention import attention_layers
from kroberta.model.layer_norm import epsilon_of
from kroberta.run_layout import HF_CLASSIFIER, SAFETENSORS_FILE
from kroberta.text.tokenizer import HF_MERGES_FILE, HF_VOCABULARY_FILE, load_tokenizer
from kroberta.tokens import BOS_ID, EOS_ID, PAD_ID

CONFIG_FILE = "config.json"
SAFETENSORS_INDEX_FILE = "model.safetensors.index.json"
TORCH_FILE = "pytorch_model.bin"
TOKENIZER_FILE = "tokenizer.json"
# Every file `export_hf` may write (the export CLI clears these before --overwrite).
EXPORT_FILES = (
    CONFIG_FILE,
    SAFETENSORS_FILE,
    TOKENIZER_FILE,
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
)
HIDDEN_ACT = "gelu"  # exact (erf) GELU in both keras and transformers
# RoBERTa's special tokens; HF positions are offset by pad id + 1, so pad must be 1.
SPECIAL_TOKENS = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "sep_token": "</s>",
    "cls_token": "<s>",
    "pad_token": "<pad>",
    "mask_token": "<mask>",
}

__all__ = ["export_hf", "init_from_hf", "ConversionError"]


# ---------------------------------------------------------------- export


def attention_dropout_of(model) -> float:
    """The dropout on `model`'s attention weights (`model.attention_dropout`; keras-hub's
    config records only the hidden rate, `backbone.dropout`)."""
    layers = attention_layers(model)
    return float(layers[0].dropout) if layers else float(model.backbone.dropout)


def hf_config(model) -> dict:
    """The `config.json` of `RobertaForMaskedLM` (or `RobertaForSequenceClassification`)
    equivalent to `model`."""
    b = model.backbone
    config = {
        "model_type": "roberta",
        "architectures": ["RobertaForMaskedLM"],
        "vocab_size": int(b.vocabulary_size),
        "hidden_size": int(b.hidden_dim),
        "num_hidden_layers": int(b.num_layers),
        "num_attention_heads": int(b.num_heads),
        "intermediate_size": int(b.intermediate_dim),
        "max_position_embeddings": int(b.max_sequence_length) + hf_weights.POSITION_OFFSET,
        "type_vocab_size": 1,
        "layer_norm_eps": epsilon_of(model),
        "hidden_act": HIDDEN_ACT,
        "position_embedding_type": "absolute",
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "hidden_dropout_prob": float(b.dropout),
        "attention_probs_dropout_prob": attention_dropout_of(model),
        # What transformers starts heads added for fine-tuning from; how the pretraining
        # started (model.initializer_range) is not part of the trained model.
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "is_decoder": False,
    }
    return {**config, **_classifier_config(model)} if hf_weights.is_classifier(model) else config


def _classifier_config(classifier) -> dict:
    """The sequence classifier's keys: its labels (`classifier.label_names` where it has
    them) and, for one output, regression."""
    if (
        classifier.hidden_dim != classifier.backbone.hidden_dim
        or keras.activations.serialize(classifier.activation) != "linear"
    ):
        raise ConversionError(
            f"a classifier head of width {classifier.hidden_dim} with activation "
            f"{keras.activations.serialize(classifier.activation)!r}: Hugging Face's "
            "RobertaClassificationHead is hidden_size wide and outputs logits"
        )
    count = int(classifier.num_classes)
    names = list(getattr(classifier, "label_names", None) or [f"LABEL_{i}" for i in range(count)])
    return {
        "architectures": [HF_CLASSIFIER],
        "kroberta_task": task_of(classifier),
        "id2label": {str(i): name for i, name in enumerate(names)},
        "label2id": {name: i for i, name in enumerate(names)},
        "problem_type": "regression" if count == 1 else "single_label_classification",
        # HF applies this one rate before and after the head's dense, as keras-hub's `dropout`.
        "classifier_dropout": float(classifier.dropout),
    }


def task_of(classifier) -> dict | None:
    """The classifier's `task_spec` (its text fields, kind, metric) as a dict, None without one."""
    spec = getattr(classifier, "task_spec", None)
    return dataclasses.asdict(spec) if spec is not None else None


def _write_json(path: str, data: dict):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")


def _export_tokenizer(tokenizer, out_dir: str, max_length: int):
    tokenizer.save(os.path.join(out_dir, TOKENIZER_FILE))
    _write_json(
        os.path.join(out_dir, "tokenizer_config.json"),
        {
            "tokenizer_class": "RobertaTokenizer",  # the fast one (tokenizer.json) where both exist
            **SPECIAL_TOKENS,
            "model_max_length": int(max_length),
            "add_prefix_space": False,
            "trim_offsets": True,
            "errors": "replace",
        },
    )
    _write_json(os.path.join(out_dir, "special_tokens_map.json"), dict(SPECIAL_TOKENS))
    # vocab.json + merges.txt let the slow (pure Python) RobertaTokenizer load it too.
    kind, vocabulary, merges = bpe_of(tokenizer)
    if kind == "BPE":
        _write_json(os.path.join(out_dir, "vocab.json"), vocabulary)
        with open(os.path.join(out_dir, "merges.txt"), "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n" + "".join(merge + "\n" for merge in merges))


def bpe_of(tokenizer) -> tuple[str | None, dict, list[str]]:
    """(model type, vocabulary, merges as "a b" lines) of a `tokenizers.Tokenizer`."""
    model = json.loads(tokenizer.to_str()).get("model", {})
    return (
        model.get("type"),
        model.get("vocab", {}),
        [merge if isinstance(merge, str) else " ".join(merge) for merge in model.get("merges", [])],
    )


def export_hf(model, out_dir: str, tokenizer=None, overwrite: bool = False) -> str:
    """Writes `model` as a Hugging Face `RobertaForMaskedLM` directory (a classifier as
    `RobertaForSequenceClassification`, its tokenizer's `model_max_length` its `max_length`).

    Args:
        model: a `kroberta.MaskedLM` (e.g. from `kroberta.load`), or a fine-tuned
            classifier (`kroberta.load`).
        out_dir: created if needed; a directory holding files is refused unless
            `overwrite`.
        tokenizer: a `tokenizers.Tokenizer` to export alongside; None uses
            `model.tokenizer` when the model has one, else no tokenizer is written.
        overwrite: replace the export of this format in `out_dir` (its tokenizer
            included); the files an export does not write stay. A directory holding
            no such export is refused even so.

    Returns:
        `out_dir`.
    """
    _, tokenizer = checked_export(
        model, tokenizer, out_dir, "export_hf", "Hugging Face's RobertaForSequenceClassification"
    )
    with staged_export(out_dir, overwrite, EXPORT_FILES, "hf") as staging:
        # transformers refuses safetensors files without this metadata. Serialised here and
        # written by Python: a full disk is an OSError (safetensors' `save_file` raises
        # its own SafetensorError), and the file gets the usual mode (`save_file` makes
        # it its owner's only).
        data = save(hf_weights.to_hf_tensors(model), metadata={"format": "pt"})
        with open(os.path.join(staging, SAFETENSORS_FILE), "wb") as f:
            f.write(data)
        _write_json(os.path.join(staging, CONFIG_FILE), hf_config(model))
        if tokenizer is not None:
            _export_tokenizer(
                tokenizer,
                staging,
                getattr(model, "max_length", None) or model.backbone.max_sequence_length,
            )
    return out_dir


# ---------------------------------------------------------------- import


def read_hf_config(directory: str) -> dict:
    return read_json_in(directory, CONFIG_FILE, "a Hugging Face model directory")


def read_json_in(directory: str, name: str, what: str) -> dict:
    """`directory/name` parsed as JSON; a missing directory or file, or bad JSON, named."""
    path = os.path.join(directory, name)
    if not os.path.isdir(directory):
        raise NotFoundError(f"{directory}: no such directory")
    if not os.path.isfile(path):
        raise NotFoundError(f"{path}: missing (not {what})")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ConversionError(f"{path}: not valid JSON: {e}") from None


def model_config_from_hf(hf: dict, source: str):
    """The kroberta `ModelConfig` for an HF RoBERTa config; refuses what kroberta cannot represent."""

    def fail(key, problem):
        raise ConversionError(f"{source}: {key}: {problem}")

    def need(key):
        if key not in hf:
            fail(key, "missing")
        value = hf[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            fail(key, f"expected a positive integer, got {value!r}")
        return value

    if hf.get("model_type") != "roberta":
        fail(
            "model_type",
            f"kroberta imports 'roberta' models only, got {hf.get('model_type')!r}"
            + (
                "; this is a keras-hub preset's config: start from it with init_from_keras_hub"
                if "registered_name" in hf
                else ""
            ),
        )
    if hf.get("position_embedding_type", "absolute") != "absolute":
        fail(
            "position_embedding_type",
            f"only 'absolute' is supported, got {hf['position_embedding_type']!r}",
        )
    if hf.get("hidden_act", HIDDEN_ACT) != HIDDEN_ACT:
        fail("hidden_act", f"keras-hub's RoBERTa uses {HIDDEN_ACT!r}, got {hf['hidden_act']!r}")
    eps = hf.get("layer_norm_eps", 1e-12)  # transformers' default when the key is absent
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        fail("layer_norm_eps", f"expected a number in (0, 1), got {eps!r}")
    if hf.get("pad_token_id", PAD_ID) != PAD_ID:
        fail(
            "pad_token_id",
            f"HF offsets positions by pad id + 1; kroberta needs {PAD_ID}, "
            f"got {hf['pad_token_id']}",
        )
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        fail("is_decoder", "decoder / cross-attention RoBERTa is not a masked LM kroberta can hold")
    # type_vocab_size > 1 is accepted: MLM inputs use token type 0 only, whose row is
    # folded into the position table; the other rows are ignored.
    shape = {key: need(hf_weights.HF_NAMES[key]) for key in hf_weights.SHAPE_KEYS}
    if shape["hidden_dim"] % shape["num_heads"]:
        fail(
            "num_attention_heads",
            f"{shape['num_heads']} heads do not divide hidden_size={shape['hidden_dim']}",
        )
    positions = shape.pop("max_sequence_length")  # HF's rows, offset by pad id + 1
    if positions <= hf_weights.POSITION_OFFSET:
        fail(
            "max_position_embeddings", f"must exceed {hf_weights.POSITION_OFFSET}, got {positions}"
        )

    def number(key, default):
        value = hf.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):  # null, "0.1"
            fail(key, f"expected a number, got {value!r}")
        return float(value)

    # Inference ignores both; training (continued pretraining) uses them as HF would.
    dropout = number("hidden_dropout_prob", 0.1)
    attention_dropout = number("attention_probs_dropout_prob", dropout)
    for key, rate in (
        ("hidden_dropout_prob", dropout),
        ("attention_probs_dropout_prob", attention_dropout),
    ):
        if not 0.0 <= rate < 1.0:
            fail(key, f"must be in [0, 1), got {rate}")
    return ModelConfig(
        **shape,
        max_sequence_length=positions - hf_weights.POSITION_OFFSET,
        dropout=dropout,
        # -1 (follow dropout) when HF's two rates are one, as kroberta writes it
        attention_dropout=FOLLOW_DROPOUT if attention_dropout == dropout else attention_dropout,
        initializer_range=number("initializer_range", 0.02),
        layer_norm_epsilon=float(eps),
    )


def _load_safetensors(path: str) -> dict:
    try:
        return load_file(path)
    except SafetensorError as e:  # a truncated or damaged file
        raise InputError(
            f"{path}: cannot read this weights file: damaged or truncated ({e})"
        ) from None
    except (TypeError, ValueError) as e:
        # numpy has no bfloat16: read such files through torch when it is there.
        try:
            from safetensors.torch import load_file as torch_load_file  # torch: an optional extra
        except ImportError:
            raise ConversionError(
                f"{path}: cannot read with numpy ({e}); installing torch lets kroberta read it"
            ) from None
        return {k: v.float().numpy() for k, v in torch_load_file(path).items()}


def read_hf_tensors(directory: str) -> tuple[dict, str]:
    """(name -> numpy array, the file read) from model.safetensors, its index, or pytorch_model.bin."""
    path = os.path.join(directory, SAFETENSORS_FILE)
    if os.path.isfile(path):
        return _load_safetensors(path), path
    index = os.path.join(directory, SAFETENSORS_INDEX_FILE)
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        tensors = {}
        for shard in shards:
            tensors.update(_load_safetensors(os.path.join(directory, shard)))
        return tensors, index
    path = os.path.join(directory, TORCH_FILE)
    if os.path.isfile(path):
        try:
            import torch  # an optional extra
        except ImportError:
            raise ConversionError(
                f"{path}: reading a PyTorch checkpoint needs torch "
                f"(pip install torch), or convert it to {SAFETENSORS_FILE}"
            ) from None
        state = torch.load(path, map_location="cpu", weights_only=True)
        return {k: v.float().numpy() for k, v in state.items()}, path
    raise NotFoundError(f"{directory}: no weights ({SAFETENSORS_FILE} or {TORCH_FILE}) found")


def read_hf_model(directory: str):
    """(HF config, kroberta `Config`, tokenizer or None, tensors, weights file) of a local
    HF RoBERTa directory (`kroberta.load` builds the head from them)."""
    hf = read_hf_config(directory)
    model_config = model_config_from_hf(hf, os.path.join(directory, CONFIG_FILE))
    tensors, source = read_hf_tensors(directory)
    tokenizer = None
    present = {
        name
        for name in (TOKENIZER_FILE, HF_VOCABULARY_FILE, HF_MERGES_FILE)
        if os.path.isfile(os.path.join(directory, name))
    }
    if TOKENIZER_FILE in present or {HF_VOCABULARY_FILE, HF_MERGES_FILE} <= present:
        # tokenizer.json, or the slow tokenizer's files, as training from this checkpoint
        # reads them: without them the model has no tokenizer to check prepared data against.
        tokenizer = load_tokenizer(directory)
    # A default `Config` with the imported model section (and the tokenizer's special ids).
    config = Config(model=model_config)
    if tokenizer is not None:
        ids = [tokenizer.token_to_id(text) for text in tokens.SPECIAL_TOKENS.values()]  # id order
        if None not in ids:
            config = config.with_section(
                "data", pad_token_id=ids[1], mask_token_id=ids[4], special_token_ids=tuple(ids)
            )
    return hf, config, tokenizer, tensors, source


def init_from_hf(model, directory: str):
    """Loads an HF RoBERTa MLM checkpoint's weights into an existing model of the same shape.

    Args:
        model: a keras-hub `RobertaMaskedLM` (e.g. the training model before `fit`).
        directory: a Hugging Face RoBERTa directory, as `kroberta.load` reads it.

    Returns:
        `model`, with its weights replaced.

    Raises:
        ConversionError: a shape key of the checkpoint differs from the model's,
            or a tensor is missing or has the wrong shape (named).
    """
    with storage.local_copy(directory) as local:  # gs://...: a temporary copy (fsspec)
        hf = read_hf_config(local)
        source = os.path.join(local, CONFIG_FILE)
        theirs = model_config_from_hf(hf, source)
        for key in hf_weights.SHAPE_KEYS:
            want, got = getattr(model.backbone, key), getattr(theirs, key)
            if want != got:
                hf_key = hf_weights.HF_NAMES[key]
                raise ConversionError(
                    f"{source}: {hf_key}={hf[hf_key]} gives model.{key}={got}, "
                    f"but the model has {want}"
                )
        tensors, weights_source = read_hf_tensors(local)
    hf_weights.load_hf_tensors(
        model, tensors, weights_source, tied=hf.get("tie_word_embeddings", True)
    )
    return model
