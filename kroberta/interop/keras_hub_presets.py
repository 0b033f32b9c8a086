"""keras-hub presets: export a kroberta model as one, read one (`kroberta.load` builds
it), and start training from one.

A kroberta model *is* a keras-hub `RobertaMaskedLM`, so the export is keras-hub's
own `save_to_preset` on a stock copy of it (`kroberta.model.mlm.stock_copy`: the
files hold nothing kroberta-specific). With a tokenizer it holds keras-hub's
`RobertaTokenizer` (`assets/tokenizer/{vocabulary.json, merges.txt}`), the masked LM's
`RobertaMaskedLMPreprocessor` inside `task.json`, and in `preprocessor.json` a
`RobertaTextClassifierPreprocessor` at the model's sequence length, so
`RobertaTextClassifier.from_preset(dir, num_classes=K)` fits as it is. keras-hub's
backbone config has one `dropout`: kroberta writes the hidden rate there (a stock
keras-hub load applies it to the attention weights too); the attention rate and the
layer-norm epsilon (keras-hub hard-codes 1e-5) travel in `kroberta_config.toml`, the
run's config, which keras-hub ignores and `kroberta.load` reads back. A fine-tuned
classifier is saved the same way as a `RobertaTextClassifier` (its class names and
task in `kroberta_classifier.json`), which `kroberta.load` reads back too.

Token ids: keras-hub's byte-level BPE gives the ids of kroberta's tokenizer for
ordinary text, but not on runs of spaces (`"a  b"`: Hugging Face's and kroberta's
`a Ġ Ġb`, keras-hub's `a ĠĠ b`, keras-hub's own behaviour), and around a literal
`<mask>` it keeps the space before it as its own token (kroberta's and Hugging Face's
`<mask>` absorb it), as keras-hub's own RoBERTa presets do: tokenize with kroberta's
tokenizer (`model.tokenizer`) where the ids must match.
"""

import dataclasses
import json
import os

import keras_hub

from kroberta import storage
from kroberta.config import Config, DataConfig, ModelConfig, load_toml, to_toml
from kroberta.errors import ConversionError
from kroberta.interop import checked_export, hf_weights, staged_export
from kroberta.interop.hf import attention_dropout_of, bpe_of, read_json_in, task_of
from kroberta.model.layer_norm import epsilon_of
from kroberta.model.mlm import KERAS_HUB_INITIALIZER_RANGE, stock_copy
from kroberta.parallel.distribute import global_distribution
from kroberta.run_layout import MASKED_LM, METADATA_FILE, model_source
from kroberta.text.tokenizer import KERAS_HUB_MERGES_FILE, KERAS_HUB_VOCABULARY_FILE, byte_level_bpe

KROBERTA_CONFIG_FILE = "kroberta_config.toml"
CONFIG_FILE = "config.json"
TASK_CONFIG_FILE = "task.json"
TASK_WEIGHTS_FILE = "task.weights.h5"
CLASSIFIER_FILE = (
    "kroberta_classifier.json"  # a classifier's class names and task (keras-hub has no place)
)
# Every file `export_keras_hub` may write (the export CLI clears them before --overwrite).
EXPORT_FILES = (
    CONFIG_FILE,
    "model.weights.h5",
    "model.weights.json",
    METADATA_FILE,
    TASK_CONFIG_FILE,
    TASK_WEIGHTS_FILE,
    "preprocessor.json",
    "tokenizer.json",
    KROBERTA_CONFIG_FILE,
    KERAS_HUB_VOCABULARY_FILE,
    KERAS_HUB_MERGES_FILE,
    CLASSIFIER_FILE,
)
BACKBONE_NAME = "RobertaBackbone"

__all__ = ["export_keras_hub", "init_from_keras_hub", "ConversionError"]


# ---------------------------------------------------------------- export


def _keras_hub_tokenizer(tokenizer, vocabulary_size: int):
    """keras-hub's `RobertaTokenizer` with the vocabulary and merges of a `tokenizers` BPE."""
    kind, vocabulary, merges = bpe_of(tokenizer)
    if kind != "BPE":
        raise ConversionError(
            f"the tokenizer is a {kind} model; keras-hub's RobertaTokenizer needs byte-level BPE"
        )
    for token_id, added in tokenizer.get_added_tokens_decoder().items():
        vocabulary.setdefault(added.content, token_id)
    if max(vocabulary.values()) >= vocabulary_size:
        raise ConversionError(
            f"the tokenizer has ids up to {max(vocabulary.values())}, beyond the model's "
            f"vocabulary_size={vocabulary_size}"
        )
    return keras_hub.models.RobertaTokenizer(vocabulary=vocabulary, merges=merges)


def _recorded_config(config, model):
    """The config `kroberta_config.toml` records: `config` (a default one with the model's
    shape when None and the model holds a rate or epsilon keras-hub's config cannot, else
    None) with the model's attention dropout and layer-norm epsilon."""
    rate, epsilon = attention_dropout_of(model), epsilon_of(model)
    if config is None:
        if rate == float(model.backbone.dropout) and epsilon == ModelConfig.layer_norm_epsilon:
            return None  # keras-hub's config says it all
        config = Config(model=preset_model_config_of(model.backbone))
    rates = {"attention_dropout": rate} if config.model.attention_dropout_rate != rate else {}
    return config.with_section("model", layer_norm_epsilon=epsilon, **rates)


def preset_model_config_of(backbone):
    """The kroberta `ModelConfig` of a keras-hub `RobertaBackbone`'s shape and dropout."""
    return ModelConfig(
        **{key: int(getattr(backbone, key)) for key in hf_weights.SHAPE_KEYS},
        dropout=float(backbone.dropout),
    )


def export_keras_hub(model, out_dir: str, tokenizer=None, overwrite: bool = False) -> str:
    """Writes `model` as a keras-hub preset directory (with `save_to_preset`).

    Args and return value as for `kroberta.export_hf`; the tokenizer (byte-level BPE)
    becomes keras-hub's `RobertaTokenizer` with a `RobertaMaskedLMPreprocessor`. A
    fine-tuned classifier becomes a `RobertaTextClassifier` preset, its preprocessor at
    the classifier's `max_length`, its `label_names` and `task_spec` in kroberta_classifier.json.
    """
    classifier, tokenizer = checked_export(
        model, tokenizer, out_dir, "export_keras_hub", "keras-hub's RobertaTextClassifier"
    )
    with staged_export(out_dir, overwrite, EXPORT_FILES, "keras-hub") as staging:
        _write_preset(model, staging, tokenizer, classifier)
    return out_dir


def _write_preset(model, out_dir: str, tokenizer, classifier: bool):
    config = _recorded_config(getattr(model, "kroberta_config", None), model)
    preprocessor = classifier_preprocessor = None
    if tokenizer is not None:
        length = int(model.backbone.max_sequence_length)
        # A model with no run config (a Hugging Face checkpoint's): RoBERTa's 15%, keras-hub's default.
        data = config.data if config is not None else DataConfig(mask_rate=0.15)
        keras_hub_tokenizer = _keras_hub_tokenizer(tokenizer, int(model.backbone.vocabulary_size))
        preprocessor = (
            None
            if classifier
            else keras_hub.models.RobertaMaskedLMPreprocessor(
                tokenizer=keras_hub_tokenizer,
                sequence_length=length,
                mask_selection_rate=data.mask_rate,
                mask_selection_length=data.prediction_slots(length),
            )
        )
        # keras-hub's classifiers build their preprocessor from preprocessor.json only when
        # it is theirs, else with 512 tokens (too many for a shorter model: "Paddings must
        # be non-negative" in fit). The masked LM reads its own from task.json, so
        # preprocessor.json is the classifier's, at the model's length.
        classifier_preprocessor = keras_hub.models.RobertaTextClassifierPreprocessor(
            tokenizer=keras_hub_tokenizer,
            sequence_length=getattr(model, "max_length", None) or length,
        )
    stock = stock_copy(model, classifier_preprocessor if classifier else preprocessor)
    with global_distribution(None):  # saving builds variables: none of them a collective
        # model.weights.h5 and task.weights.h5 together hold each weight at most once.
        storage.check_room_for_hdf5(os.path.join(out_dir, "model.weights.h5"), stock.weights)
        stock.save_to_preset(out_dir)
        if classifier_preprocessor is not None and not classifier:
            classifier_preprocessor.save_to_preset(out_dir)
    if config is not None:
        with open(os.path.join(out_dir, KROBERTA_CONFIG_FILE), "w", encoding="utf-8") as f:
            f.write(to_toml(config))
    if classifier:
        with open(os.path.join(out_dir, CLASSIFIER_FILE), "w", encoding="utf-8") as f:
            json.dump(
                {
                    "label_names": list(getattr(model, "label_names", None) or []) or None,
                    "task": task_of(model),
                },
                f,
            )


# ---------------------------------------------------------------- import


def preset_model_config(directory: str):
    """The kroberta `ModelConfig` of a keras-hub RoBERTa preset's `config.json`."""
    path = os.path.join(directory, CONFIG_FILE)
    data = read_json_in(directory, CONFIG_FILE, "a keras-hub preset directory")
    name = str(data.get("registered_name", ""))
    if not name.endswith(BACKBONE_NAME):
        raise ConversionError(
            f"{path}: registered_name: kroberta reads {BACKBONE_NAME} presets, got "
            f"{name or data.get('model_type') or 'none'!r}"
            + (
                "; this is a Hugging Face config: start from it with init_from_hf"
                if "model_type" in data
                else ""
            )
        )
    values = data.get("config", {})
    for key in hf_weights.SHAPE_KEYS:
        if (
            not isinstance(values.get(key), int)
            or isinstance(values.get(key), bool)
            or values[key] < 1
        ):
            raise ConversionError(
                f"{path}: config.{key}: expected a positive integer, got {values.get(key)!r}"
            )
    # keras-hub's RoBERTa has no setting for it: it always starts from this.
    return ModelConfig(
        **{k: values[k] for k in hf_weights.SHAPE_KEYS},
        dropout=float(values.get("dropout", 0.0)),
        initializer_range=KERAS_HUB_INITIALIZER_RANGE,
    )


def preset_tokenizer(directory: str):
    """A `tokenizers.Tokenizer` rebuilt from the preset's vocabulary.json and merges.txt
    (`kroberta.text.tokenizer.byte_level_bpe`: Hugging Face's ids); None without them."""
    vocabulary = os.path.join(directory, KERAS_HUB_VOCABULARY_FILE)
    merges = os.path.join(directory, KERAS_HUB_MERGES_FILE)
    return (
        byte_level_bpe(vocabulary, merges)
        if os.path.isfile(vocabulary) and os.path.isfile(merges)
        else None
    )


def load_weights_into(model, directory: str):
    """Copies the preset's weights into `model` (same shape); returns whether the MLM
    head came from the preset (a backbone-only preset leaves the head as it was)."""
    if os.path.isfile(os.path.join(directory, TASK_WEIGHTS_FILE)):
        with storage.reading(os.path.join(directory, TASK_WEIGHTS_FILE), "weights file"):
            task = keras_hub.models.RobertaMaskedLM.from_preset(
                directory, preprocessor=None, dtype="float32"
            )
        model.set_weights(task.get_weights())
        return True
    with storage.reading(os.path.join(directory, "model.weights.h5"), "weights file"):
        backbone = keras_hub.models.RobertaBackbone.from_preset(directory, dtype="float32")
    model.backbone.set_weights(backbone.get_weights())
    return False


def preset_config(directory: str, masked_lm: bool = False):
    """kroberta's `Config` of a local preset: the exported run's (else a default one) with
    the preset's model section; `masked_lm`: refuse a `RobertaTextClassifier` preset (training
    starts from a masked LM)."""
    if masked_lm:
        model_source(directory, "init_from_keras_hub", head=MASKED_LM)
    model_config = preset_model_config(directory)
    saved = os.path.join(directory, KROBERTA_CONFIG_FILE)
    if not os.path.isfile(saved):
        return Config(model=model_config)
    config = load_toml(saved)
    # What keras-hub's config cannot hold: the attention rate (else -1: follow dropout)
    # and the layer-norm epsilon.
    rate = config.model.attention_dropout_rate
    return dataclasses.replace(
        config,
        model=dataclasses.replace(
            model_config,
            layer_norm_epsilon=config.model.layer_norm_epsilon,
            attention_dropout=rate
            if rate != model_config.dropout
            else model_config.attention_dropout,
        ),
    )


def init_from_keras_hub(model, directory: str) -> bool:
    """Loads a keras-hub RoBERTa preset's weights into an existing model of the same shape.

    Returns whether the MLM head came from the preset too (False for a
    backbone-only preset: the head keeps its initial weights). Raises
    `ConversionError` naming the first shape key that differs.
    """
    with storage.local_copy(directory) as local:  # gs://...: a temporary copy (fsspec)
        model_source(local, "init_from_keras_hub", head=MASKED_LM)
        theirs = preset_model_config(local)
        for key in hf_weights.SHAPE_KEYS:
            if getattr(theirs, key) != getattr(model.backbone, key):
                raise ConversionError(
                    f"{os.path.join(local, CONFIG_FILE)}: config.{key}="
                    f"{getattr(theirs, key)}, but the model has "
                    f"model.{key}={getattr(model.backbone, key)}"
                )
        return load_weights_into(model, local)
