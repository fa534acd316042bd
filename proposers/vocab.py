"""Identity of a tokenizer's vocabulary, written into files learned with it (matrices, datastores).

Two tokenizers with the same token strings at the same ids give the same
fingerprint, whatever their file names; loading a file learned with another
vocabulary would silently draft nonsense, so loaders compare fingerprints.
"""
from __future__ import annotations

import hashlib
from typing import Mapping


def vocab_fingerprint(vocab: Mapping[str, int]) -> str:
    """``sha256:`` of the (id, token) pairs in id order."""
    h = hashlib.sha256()
    for token, idx in sorted(vocab.items(), key=lambda item: item[1]):
        h.update(f"{idx}\t{token}\n".encode("utf-8", "surrogatepass"))
    return "sha256:" + h.hexdigest()
