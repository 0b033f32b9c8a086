"""Where a run's data comes from: explicit files, a prepared directory, or the embedded corpus.

`resolve(config)` returns the config with `data.train`/`data.validation` filled in
and the tokenizer file to keep with the run (or None).
"""

import dataclasses
import os

from kroberta.config import Config, ConfigError

# The embedded default job's corpus: the standard library's docstrings, which every
# Python installation has, prepared once per run directory.
EMBEDDED_DIR = "embedded-data"


def resolve(config: Config, log=print) -> tuple[Config, str | None]:
    data = config.data
    if data.dir:
        return _from_manifest(config, data.dir, "data.dir")
    if data.train:
        return config, None
    prepared = os.path.join(_local_home(config.run_dir), EMBEDDED_DIR)
    if not os.path.isfile(os.path.join(prepared, "manifest.json")):
        _prepare_embedded(config, prepared, log)
    return _from_manifest(config, prepared, "embedded corpus")


def _prepare_embedded(config: Config, out_dir: str, log):
    from kroberta.text.build import prepare
    from kroberta.text import corpus

    home = _local_home(config.run_dir)
    os.makedirs(home, exist_ok=True)
    text_path = os.path.join(home, "embedded-corpus.txt")
    log("no data given: building the embedded corpus from the Python standard library's docstrings")
    stats = corpus.write_stdlib_corpus(text_path)
    log(f"  {stats}")
    prepare(
        [text_path], out_dir,
        vocab_size=config.model.vocabulary_size,
        seq_len=config.model.max_sequence_length,
        validation_fraction=0.02,
        seed=config.train.seed,
        progress=False,
    )


def _local_home(run_dir: str) -> str:
    """Where the embedded corpus is prepared: the run directory, or for a URL one (whose
    files tf.data may not read) a local directory of its own, rebuilt when missing (it is
    the same corpus every time)."""
    if "://" not in run_dir:
        return run_dir
    import hashlib
    import tempfile

    digest = hashlib.sha256(run_dir.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"kroberta-embedded-{digest}")


def _from_manifest(config: Config, directory: str, key: str) -> tuple[Config, str]:
    from kroberta.data.manifest import load_manifest

    manifest = load_manifest(directory)
    if manifest.vocabulary_size != config.model.vocabulary_size:
        raise ConfigError(
            f"{key}: {directory} was prepared with a vocabulary of {manifest.vocabulary_size} "
            f"tokens but model.vocabulary_size={config.model.vocabulary_size}; set "
            f"--model.vocabulary_size={manifest.vocabulary_size}"
        )
    if manifest.sequence_length > config.model.max_sequence_length:
        raise ConfigError(
            f"{key}: {directory} holds sequences of {manifest.sequence_length} tokens but "
            f"model.max_sequence_length={config.model.max_sequence_length}"
        )
    special = manifest.special_tokens
    data = dataclasses.replace(
        config.data,
        train=tuple(manifest.train_files),
        validation=tuple(manifest.validation_files) or config.data.validation,
        pad_token_id=special.get("pad", config.data.pad_token_id),
        mask_token_id=special.get("mask", config.data.mask_token_id),
        special_token_ids=tuple(sorted(set(special.values()))) or config.data.special_token_ids,
    )
    return dataclasses.replace(config, data=data), manifest.tokenizer_path
