"""When is a new memory the same fact as a stored one (seed §3.3: dedup before writing)?

Cosine similarity alone cannot tell "order 1042 was lost" from "order 1043 was lost" (0.94 with
the default embedder) or "华东地区失败最多" from "华南地区失败最多" (0.92), while honest paraphrases
across languages score as low as 0.69. Merging two different facts loses one of them, which is
worse than keeping a near-duplicate, so two cheap deterministic checks veto a merge first:

* different numbers or ids (digits, ``C2024-118``, ``30%``, ``UTC+8``) mean different facts
  (Arabic digits only: "五点" / "九点" is left to the contrast check below);
* a *contrast pair*, the same sentence frame with one span swapped ("by channel" / "by day",
  "顺丰" / "圆通", "Monday mornings" / "Friday evenings"), is a different fact, however close
  the vectors are. A paraphrase rewords the frame itself, so it is not caught.

Only then does the cosine threshold decide. ``DUPLICATE_THRESHOLD`` was chosen on the labelled
pairs in tests/corpus/memory_pairs.json (see tests/test_memory_store.py for the measured rates).
"""

from __future__ import annotations

import os
import re
import unicodedata

DUPLICATE_THRESHOLD = 0.66
"""Cosine at or above which two facts that pass the vetoes are the same fact (default embedder)."""

CONTRAST_FRAME = 0.5
"""A pair is a contrast when its shared prefix and suffix cover at least this share of the longer text."""

_NUMBER = re.compile(r"[a-z]*\d(?:[\d.,\-+%/:]*[a-z\d%])?", re.ASCII)
_NOISE = re.compile(r"[\W_]+", re.UNICODE)


def normalise(text: str) -> str:
    """Case, width and punctuation folded, so "Dark mode." and "dark mode" compare equal."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return _NOISE.sub(" ", folded).strip()


def numbers(text: str) -> frozenset[str]:
    """The number-like tokens of a text: ids, amounts, percentages, times."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return frozenset(m.group(0) for m in _NUMBER.finditer(folded))


def is_contrast(a: str, b: str) -> bool:
    """Same frame, one span swapped: shared prefix + suffix cover most of the text, and both
    texts have something of their own in between."""
    a, b = normalise(a), normalise(b)
    if a == b:
        return False
    prefix = len(os.path.commonprefix([a, b]))
    suffix = len(os.path.commonprefix([a[prefix:][::-1], b[prefix:][::-1]]))
    own_a, own_b = len(a) - prefix - suffix, len(b) - prefix - suffix
    return own_a > 0 and own_b > 0 and prefix + suffix >= CONTRAST_FRAME * max(len(a), len(b))


def same_fact(a: str, b: str, cosine: float, threshold: float = DUPLICATE_THRESHOLD) -> bool:
    """Whether ``b`` restates ``a`` (and may supersede it) given their embeddings' cosine."""
    if normalise(a) == normalise(b):
        return True
    if numbers(a) != numbers(b) or is_contrast(a, b):
        return False
    return cosine >= threshold
