"""What `kroberta.predict(classifier, texts)` refuses, said with what the texts are."""

import numpy as np
import pytest

from kroberta.downstream.prediction import predict_texts
from kroberta.errors import InputError

EXPECTED = (
    "texts: expected a list of strings, or two lists (a pair task's first and second texts), got "
)


@pytest.mark.fast
@pytest.mark.parametrize(
    "texts, got",
    [
        ("one text", "one string (a list of one: [text])"),
        (["a text", 3], "a list whose item 1 is int '3'"),
        (["a text", None], "a list whose item 1 is NoneType 'None'"),
        (np.array([1, 2]), "a list whose item 0 is int '1'"),  # as its tolist()
        ([["a", "b"], ["c"]], "2 lists of 2, 1 texts"),
        ([["a"], ["b"], ["c"]], "3 lists of 1, 1, 1 texts"),
        ([], "an empty list"),
        (3, "int"),
    ],
)
def test_refused_texts_say_what_they_are(texts, got):
    with pytest.raises(InputError) as refused:
        predict_texts(None, texts)  # refused before the classifier is read
    assert str(refused.value) == EXPECTED + got
