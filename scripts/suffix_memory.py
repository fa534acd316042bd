"""Memory of the suffix source's global tree (arctic-inference's SuffixDecodingCache) by responses held.

Inserts ``--responses`` distinct random responses of ``--tokens`` tokens each (the worst case: nothing shared)
into a cache bounded at ``--max-cached`` responses, and prints arctic's own estimate and the growth of this
process's resident memory every 2,000 responses. The figure docs/hybrid.md quotes (about 260 bytes a token):

    .venv/bin/python scripts/suffix_memory.py --responses 12000 --tokens 128 --max-cached 10000
"""
from __future__ import annotations

import argparse

import numpy as np


def rss_mib() -> int:
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) // 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--responses", type=int, default=12_000)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--max-cached", type=int, default=10_000)
    p.add_argument("--depth", type=int, default=24, help="max_tree_depth")
    args = p.parse_args()
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    cache = SuffixDecodingCache(max_tree_depth=args.depth, max_cached_requests=args.max_cached)
    base, rng = rss_mib(), np.random.default_rng(0)
    for i in range(args.responses):
        cache.start_request(i, np.zeros(0, dtype=np.int32))
        cache.add_active_response(i, rng.integers(0, 49152, size=args.tokens).astype(np.int32))
        cache.stop_request(i)
        if (i + 1) % 2000 == 0:
            estimate = cache._global_tree.estimate_memory() / 2**20
            held = min(i + 1, args.max_cached) * args.tokens
            print(f"{i + 1} responses: estimate {estimate:.0f} MiB ({estimate * 2**20 / held:.0f} B a token held), "
                  f"RSS +{rss_mib() - base} MiB", flush=True)


if __name__ == "__main__":
    main()
