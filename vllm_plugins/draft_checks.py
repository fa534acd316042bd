"""A plugin's drafts made safe for vLLM: at most k token ids a row, none past the model's length limit, every
one inside the vocabulary, as plain ints (what the adapter hands vLLM; a bad draft raises, so the step drafts
nothing)."""
from __future__ import annotations

from typing import Sequence

from freespec.proposers.api import Draft


def draft_rooms(views: Sequence[tuple[object, int]], lengths: Sequence[int], k: int, max_model_len: int) -> list[int]:
    """Each row's room for draft tokens: none while it prefills (no new token), else up to ``k`` and no further
    than one token short of ``max_model_len``. ``views``: (tokens, new tokens) per row; ``lengths``: its tokens."""
    return [0 if num_new == 0 else max(0, min(k, max_model_len - 1 - int(length)))
            for (_, num_new), length in zip(views, lengths)]


def checked_draft(draft: Draft, room: int, vocab_size: int) -> Draft:
    """A plugin's draft as plain ints, at most ``room`` tokens, every one inside the vocabulary."""
    if not isinstance(draft, Draft):
        raise TypeError(f"draft() must return freespec.proposers.base.Draft objects, got {type(draft).__name__}")
    tokens = [int(t) for t in draft.tokens[: max(0, room)]]
    for t in tokens:
        if not 0 <= t < vocab_size:
            raise ValueError(f"draft token {t} outside the vocabulary [0, {vocab_size})")
    chances = None
    if draft.chances is not None:
        chances = [float(c) for c in draft.chances[: len(tokens)]]
        if len(chances) < len(tokens):
            chances = None  # not one per token: the draft is not cut or trimmed
    source = draft.source if isinstance(draft.source, str) else None
    return Draft(tokens, chances, source)
