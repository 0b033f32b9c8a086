"""A plain numpy reference of kroberta's masking, written row by row from its description
(`kroberta.masking`), for the tests to compare the one implementation with.

Slow on purpose: Python loops over rows, words and slots, no shared code or constants.
"""

import numpy as np

IGNORE = -100
_M32 = 0xFFFFFFFF


def mix(x: int) -> int:
    """lowbias32 of one uint32 (Python ints, wrapped by hand)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def element_key(seed: int, index: int) -> int:
    """The key of element `index` under `seed`: the seed's low and high words, then the
    index's, xor-ed in one after another between mixes (the first after 0x9E3779B9)."""
    seed, index = seed & (2**64 - 1), index & (2**64 - 1)
    key = mix((seed & _M32) ^ 0x9E3779B9)
    key = mix(key ^ (seed >> 32))
    key = mix(key ^ (index & _M32))
    return mix(key ^ (index >> 32))


def element_keys(seed: int, indices) -> np.ndarray:
    return np.array([element_key(seed, int(i)) for i in indices], np.uint32)


def hashed(key: int, salt: int, count: int) -> list[int]:
    """`count` 24-bit numbers of stream `salt` of an element key."""
    salted = mix(key ^ ((salt * 0x846CA68B) & _M32))
    return [mix((salted + j) & _M32) >> 8 for j in range(count)]


def _uniforms(key: int, salt: int, count: int) -> list:
    return [np.float32(bits) / np.float32(2**24) for bits in hashed(key, salt, count)]


def _budget(n: int, rate: float, slots: int) -> int:
    wanted = int(np.round(np.float32(rate) * np.float32(n)))  # half to even, in float32
    if n > 0 and rate > 0:
        wanted = max(wanted, 1)
    else:
        wanted = 0
    return min(wanted, n, slots)


def _chosen_tokens(scores, candidates, count):
    """The `count` candidates of highest score (ties to the lower position), in
    position order."""
    ranked = sorted((i for i in range(len(scores)) if candidates[i]), key=lambda i: (-scores[i], i))
    return sorted(ranked[:count])


def _chosen_words(ids, candidates, count, slots, key, word_starts):
    """Whole words, each scored by its ordinal's hash, taken best first while the next
    fits the slots and its middle lies within `count` tokens (the first always)."""
    words, current = [], None
    for i in range(len(ids)):
        if not candidates[i]:
            current = None
            continue
        if current is None or word_starts[ids[i]]:
            current = []
            words.append(current)
        current.append(i)
    scores = hashed(key, 1, len(ids))
    order = sorted(range(len(words)), key=lambda w: (-scores[w], words[w][0]))
    chosen = []
    for w in order:
        before, after = len(chosen), len(chosen) + len(words[w])
        if count == 0 or after > slots or (before > 0 and before + after > 2 * count):
            break
        chosen.extend(words[w])
    return chosen


def dynamic_mask(
    ids,
    real,
    seed,
    indices,
    *,
    mask_rate,
    slots,
    mask_token_id,
    special_token_ids,
    vocabulary_size,
    word_starts=None,
):
    """(masked ids (B, L), positions (B, M), labels (B, M)) int32, row by row."""
    ids = np.asarray(ids, np.int64)
    rows, length = ids.shape
    masked = ids.copy()
    positions = np.zeros((rows, slots), np.int64)
    labels = np.full((rows, slots), IGNORE, np.int64)
    regular = [i for i in range(vocabulary_size) if i not in special_token_ids]  # random ids
    for r in range(rows):
        key = element_key(seed, int(indices[r]))
        candidates = [
            bool(real[r, i]) and int(ids[r, i]) not in special_token_ids for i in range(length)
        ]
        count = _budget(sum(candidates), mask_rate, slots)
        if word_starts is None:
            chosen = _chosen_tokens(hashed(key, 1, length), candidates, count)
        else:
            chosen = _chosen_words(ids[r], candidates, count, slots, key, word_starts)
        draws, randoms = _uniforms(key, 2, slots), _uniforms(key, 3, slots)
        for j, p in enumerate(chosen):
            positions[r, j], labels[r, j] = p, ids[r, p]
            if draws[j] < np.float32(0.8):
                masked[r, p] = mask_token_id
            elif draws[j] < np.float32(0.9):
                masked[r, p] = regular[
                    min(int(randoms[j] * np.float32(len(regular))), len(regular) - 1)
                ]
    return masked.astype(np.int32), positions.astype(np.int32), labels.astype(np.int32)


def static_slots(labels, slots):
    """(positions (B, M), slot labels (B, M), dropped (B,)): each row's first M labelled
    positions, by a stable argsort."""
    labels = np.asarray(labels)
    rows = labels.shape[0]
    positions = np.zeros((rows, slots), np.int32)
    slot_labels = np.full((rows, slots), IGNORE, np.int32)
    dropped = np.zeros(rows, np.int32)
    for r in range(rows):
        labelled = np.argsort(labels[r] == IGNORE, kind="stable")[
            : int((labels[r] != IGNORE).sum())
        ]
        kept = labelled[:slots]
        positions[r, : len(kept)] = kept
        slot_labels[r, : len(kept)] = labels[r, kept]
        dropped[r] = len(labelled) - len(kept)
    return positions, slot_labels, dropped
