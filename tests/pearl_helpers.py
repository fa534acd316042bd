"""What the pearl tests share: the tiny draft model's vocabulary (tests/conftest.py builds it), a proposer on
it for any placement, and, for the remote placements ("process", "ray"), waiting for a restarted draft and a
scripted run of steps."""
import time

import numpy as np

from freespec.proposers.base import EngineInfo, Row
from freespec.proposers.pearl.proposer import PearlOptions, PearlProposer

VOCAB = 96  # the vocabulary of the tiny_dir fixture (tests/conftest.py)


def make(tiny_dir, placement, k=4, **options):
    """A pearl proposer drafting exactly k tokens a step (no confidence cut, no adaptive length)."""
    options = {"min_confidence": 0.0, "adaptive_length": False, "placement": placement, **options}
    p = PearlProposer(PearlOptions(draft_model=tiny_dir, **options), k)
    p.bind(EngineInfo(vocab_size=VOCAB))
    return p


def arr(seq):
    return np.asarray(seq, dtype=np.int32)


def wait_for_chain(p, row, seconds=60.0):
    """Steps draft nothing while a restarted draft loads; the first chain once it is ready."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        chain = p.propose([row])[0]
        if chain:
            return chain
        time.sleep(0.05)
    raise AssertionError("the restarted draft did not come back")


def scripted_steps(p, k, reference, steps=5, on_chain=None):
    """Two requests through hits, misses and rollbacks; every chain, step by step.

    The target keeps ``step % (k + 1)`` draft tokens, then its own token: the draft's guess when all were
    kept (post-verify hits), another token otherwise (a miss, a rollback). Rows change order between
    steps. ``on_chain(step, key, context, chain)`` sees each chain with the context it was drafted for.
    """
    contexts = {0: [5, 17, 33, 2], 1: [9, 1, 70, 44, 3, 8]}
    num_new = {0: 1, 1: 1}
    seen = []
    for step in range(steps):
        keys = list(contexts)[:: (-1) ** step]
        chains = p.propose([Row(key, arr(contexts[key]), num_new[key]) for key in keys])
        seen.append(chains)
        for key, chain in zip(keys, chains):
            if on_chain is not None:
                on_chain(step, key, contexts[key], chain)
            kept = chain[: step % (k + 1)]
            bonus = reference(contexts[key] + kept, 1)[0]
            if len(kept) < k:
                bonus = (bonus + 1) % VOCAB
            num_new[key] = len(kept) + 1
            contexts[key] = contexts[key] + kept + [bonus]
        assert p.wait_idle()
    return seen
