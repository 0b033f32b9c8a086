"""Fill-mask examples printed at the end of the embedded default job."""

import kroberta

# Sentences in the register of the standard library's docstrings (the default corpus).
SENTENCES = (
    "Return the number <mask> items in the list.",
    "If the file does not exist, an <mask> is raised.",
    "Return True if the object is an instance <mask> the class.",
    "The default value <mask> None.",
    "This method returns a <mask> of strings.",
)


def print_fill_mask_examples(run_dir: str, top_k: int = 3):
    model = kroberta.load(run_dir)
    results = kroberta.fill_mask(model, list(SENTENCES), top_k=top_k)
    print("fill-mask examples (top %d):" % top_k)
    for sentence, candidates in zip(SENTENCES, results):
        guesses = ", ".join(f"{c['token_str'].strip()!r} {c['score']:.2f}" for c in candidates)
        print(f"  {sentence}\n      -> {guesses}")
