"""``phrases``: when a request ends with the start of a phrase you gave, draft the rest of that phrase.

For outputs that repeat fixed text: disclaimers, sign-offs, boilerplate, a product's name, a JSON schema's keys.
It keeps nothing per request (the adapter hands it each request's whole sequence every step), so ``release``
has nothing to drop; its only state is the phrase index, bounded by the options.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Union

import numpy as np
from pydantic import Field, field_validator

from freespec.proposers.base import Draft, EngineInfo, Proposer, ProposerOptions, Row, StepContext

Phrase = Union[str, list[int]]
MAX_PHRASES, MAX_PHRASE_TOKENS = 10_000, 512


class PhraseOptions(ProposerOptions):
    phrases: list[Phrase] = Field(
        ..., min_length=1, max_length=MAX_PHRASES,
        description="phrases to draft from: text (tokenized with the model's tokenizer at start) or token ids")
    min_match: int = Field(2, ge=1, le=64, description="tokens of a phrase a request must end with before its rest is drafted")
    chance: float = Field(0.9, gt=0.0, le=1.0,
                          description="estimated chance that each next phrase token is accepted (the policy cuts "
                          "a draft where the running product falls below its price of a draft token)")

    @field_validator("phrases")
    @classmethod
    def _phrases(cls, phrases: list[Phrase]) -> list[Phrase]:
        for i, p in enumerate(phrases):
            if isinstance(p, str) and not p.strip():
                raise ValueError(f"phrase {i} is empty")
            if isinstance(p, list) and not 2 <= len(p) <= MAX_PHRASE_TOKENS:
                raise ValueError(f"phrase {i} has {len(p)} token ids; give 2 to {MAX_PHRASE_TOKENS}")
            if isinstance(p, list) and min(p) < 0:
                raise ValueError(f"phrase {i} has a negative token id")
        return phrases


class PhraseProposer(Proposer):
    Options = PhraseOptions

    def __init__(self, options: PhraseOptions, num_speculative_tokens: int) -> None:
        super().__init__(options, num_speculative_tokens)
        # last token of a phrase prefix -> (phrase, prefix length): where a request's suffix may match
        self._index: dict[int, list[tuple[np.ndarray, int]]] = {}
        self._bytes = 0
        self._add([p for p in options.phrases if isinstance(p, list)])

    def _add(self, phrases: list[list[int]]) -> None:
        for p in phrases:
            ids = np.asarray(p[:MAX_PHRASE_TOKENS], dtype=np.int64)
            self._bytes += ids.nbytes + 64 * max(0, len(ids) - self.options.min_match)  # the array, its entries
            for m in range(self.options.min_match, len(ids)):  # a prefix of m tokens, with a rest to draft
                self._index.setdefault(int(ids[m - 1]), []).append((ids, m))

    def bind(self, info: EngineInfo) -> None:
        texts = [p for p in self.options.phrases if isinstance(p, str)]
        if texts:
            try:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(info.model)
            except Exception as e:
                raise ValueError(f"option 'phrases': text phrases need the model's tokenizer, and {info.model!r}'s "
                                 f"cannot be loaded ({type(e).__name__}: {e}); give token ids instead") from None
            # A phrase inside a sentence follows a space: both spellings are indexed.
            variants = set(texts) | {" " + t for t in texts if not t[0].isspace()}
            self._add([ids for v in sorted(variants)
                       if len(ids := tokenizer(v, add_special_tokens=False)["input_ids"]) >= 2])
        for p in self.options.phrases:
            if isinstance(p, list) and max(p) >= info.vocab_size:
                raise ValueError(f"option 'phrases': token id {max(p)} outside the model's vocabulary "
                                 f"[0, {info.vocab_size})")

    def draft(self, rows: Sequence[Row], step: StepContext) -> list[Draft]:
        return [self._draft(row.tokens) for row in rows]

    def _draft(self, tokens: np.ndarray) -> Draft:
        if len(tokens) == 0:
            return Draft([])
        best, best_m = None, 0
        for ids, m in self._index.get(int(tokens[-1]), ()):
            if best_m < m <= len(tokens) and np.array_equal(tokens[-m:], ids[:m]):
                best, best_m = ids, m
        if best is None:
            return Draft([])
        rest = [int(t) for t in best[best_m:best_m + self.k]]
        return Draft(rest, [self.options.chance ** (i + 1) for i in range(len(rest))])

    def state_bytes(self) -> int:
        return self._bytes
