"""Data on URLs: a prepared directory at a file:// URL (the code path gs:// takes: its
manifest and tokenizer through kroberta.storage, its records through tf.data, both of
which read file:// URLs) resolves, and its batches equal those of the same files on disk."""

import dataclasses
import os
import uuid

import numpy as np
import pytest
import tensorflow as tf

import kroberta
from kroberta import storage
from kroberta.data.manifest import load_manifest
from kroberta.text.tokenizer import load_tokenizer
from tests.conftest import prepare_word_corpus

# The fast tier (docs/contributing.md): builds no model and starts no process.
pytestmark = pytest.mark.fast


def _copy_to_url(local_dir, root) -> str:
    url = f"file://{root}/kroberta-{uuid.uuid4().hex[:8]}/data"
    for name in os.listdir(local_dir):
        storage.write_bytes(f"{url}/{name}", storage.read_bytes(os.path.join(local_dir, name)))
    return url


def test_a_prepared_directory_on_a_url_reads_like_the_local_one(tmp_path):
    local = prepare_word_corpus(tmp_path, ["red", "green", "blue", "sky", "sea"], 200)
    url = _copy_to_url(local, tmp_path)
    on_disk, remote = load_manifest(local), load_manifest(url)
    assert remote.train_files == tuple(f"{url}/{os.path.basename(f)}" for f in on_disk.train_files)
    assert remote.tokenizer_path == f"{url}/tokenizer.json"
    assert (
        load_tokenizer(remote.tokenizer_path).to_str()
        == load_tokenizer(on_disk.tokenizer_path).to_str()
    )

    config = kroberta.load_config("tiny")
    config = dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, vocabulary_size=on_disk.vocabulary_size),
        run_dir=str(tmp_path / "run"),
    )
    batches = {}
    for where, directory in (("local", str(local)), ("url", url)):
        with_dir = dataclasses.replace(config, data=dataclasses.replace(config.data, dir=directory))
        batch = next(iter(kroberta.dataset(with_dir, masks_on_host=True)))
        batches[where] = tf.nest.map_structure(np.asarray, batch)
    tf.nest.map_structure(np.testing.assert_array_equal, batches["local"], batches["url"])


def test_the_data_sources_are_found_once_for_a_directory_or_patterns(tmp_path):
    from kroberta.config import DataConfig
    from kroberta.data.file_patterns import DataSources, find_sources
    from kroberta.errors import InputError

    local = prepare_word_corpus(tmp_path, ["red", "green", "blue", "sky", "sea"], 200)
    url = _copy_to_url(local, tmp_path)
    remote = load_manifest(url)
    found = find_sources(DataConfig(dir=url))
    assert (found.train, found.validation) == (remote.train_files, remote.validation_files)
    assert (found.manifest, found.directory, found.key) == (remote, url, "data.dir")
    named = find_sources(DataConfig(train=(f"{url}/train-*",), validation=(f"{url}/valid*",)))
    assert (named.train, named.validation, named.manifest) == (
        remote.train_files,
        remote.validation_files,
        None,
    )
    # No training data: the embedded corpus, prepared later, brings its own files.
    assert find_sources(DataConfig(validation=(f"{url}/none*",))) == DataSources((), ())
    with pytest.raises(InputError, match=r"^data.validation: no file matches '.*/none\*'$"):
        find_sources(DataConfig(train=(f"{url}/train-*",), validation=(f"{url}/none*",)))
