"""Prepare's machinery: text and record files, the corpus, the tokenizer, encoding, packing, splits."""
