"""RoBERTa's token conventions, shared by the records, the tokenizer and the model.

The five special tokens come first in every kroberta vocabulary, in this order, so
their ids do not depend on the vocabulary size (RoBERTa's first four, with <mask>
moved from last to 4). A label of IGNORE_LABEL marks a position without loss
(Hugging Face's convention), in records on disk and in the model's targets.
"""

SPECIAL_TOKENS = {"bos": "<s>", "pad": "<pad>", "eos": "</s>", "unk": "<unk>", "mask": "<mask>"}
BOS_ID, PAD_ID, EOS_ID, UNK_ID, MASK_ID = range(len(SPECIAL_TOKENS))
SPECIAL_IDS = (BOS_ID, PAD_ID, EOS_ID, UNK_ID, MASK_ID)
FIRST_REGULAR_ID = len(SPECIAL_IDS)
IGNORE_LABEL = -100
