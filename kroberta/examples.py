"""Fill-mask examples printed at the end of the embedded default job."""

import kroberta

# Sentences in the register of the standard library's docstrings (the default corpus).
SENTENCES = (
    "Return the <mask> of the list.",
    "If the file does not <mask>, an error is raised.",
    "This module provides functions for working with <mask> and times.",
    "Raise a ValueError if the <mask> is negative.",
    "The default value is <mask>.",
)


def print_fill_mask_examples(run_dir: str, top_k: int = 3):
    model = kroberta.load(run_dir)
    results = kroberta.fill_mask(model, list(SENTENCES), top_k=top_k)
    print("fill-mask examples (top %d):" % top_k)
    for sentence, candidates in zip(SENTENCES, results):
        guesses = ", ".join(f"{c['token_str'].strip()!r} {c['score']:.2f}" for c in candidates)
        print(f"  {sentence}\n      -> {guesses}")
