"""What a state directory costs one replica, at the defaults: a save of a full store (10,000 responses of 200
tokens) as the background thread writes it, and a start that loads its own file and merges one full peer file
(the suffix source's start with one peer); with ``--many N``, the suffix source's whole start (its trees
seeded) in a folder of N peer files of 30 responses each, at ``max_saved_responses`` 500. Median of ``--repeat``
runs, wall and CPU seconds.

    python scripts/state_dir_costs.py --folder /dev/shm/fs-costs        # the freespec on sys.path

Compare two versions by putting each on ``PYTHONPATH`` in turn (the issue-86 results page does).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time

import numpy as np
from freespec.proposers.learned import state_dir
from freespec.proposers.learned.response_store import ResponseStore

FP, VOCAB = "sha256:costs", 50_000


def full_store(path: str, seed: int) -> ResponseStore:
    rng = np.random.default_rng(seed)
    store = ResponseStore(path, fingerprint=FP, vocab_size=VOCAB, perms=state_dir.FILE_MODE)
    for _ in range(10_000):
        store.add(rng.integers(0, VOCAB, 200, dtype=np.int32))
    return store


def timed(fn) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", default="/dev/shm/freespec-state-costs", help="a scratch folder (removed first)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--many", type=int, default=0, help="also time a start among this many peer files")
    args = ap.parse_args()
    shutil.rmtree(args.folder, ignore_errors=True)
    os.makedirs(args.folder, mode=0o700)
    own = state_dir.own_file(args.folder, "suffix", "bin")
    store = full_store(own, 1)
    saves = [timed(lambda: store._save(store._snapshot())) for _ in range(args.repeat)]
    peer = full_store(os.path.join(os.path.dirname(own), "peer.0.1.bin"), 2)
    peer.save()

    def start() -> None:
        fresh = ResponseStore(own, fingerprint=FP, vocab_size=VOCAB, perms=state_dir.FILE_MODE)
        state_dir.sweep_old(os.path.dirname(own))
        fresh.load()
        for path in state_dir.peer_files(own):
            fresh.merge_from(path)

    starts = [timed(start) for _ in range(args.repeat)]
    for what, runs in (("save", saves), ("start with one peer", starts)):
        print(f"{what}: wall {statistics.median(r[0] for r in runs) * 1e3:.1f} ms, "
              f"cpu {statistics.median(r[1] for r in runs) * 1e3:.1f} ms (median of {len(runs)})")
    if args.many:
        many_peers(args.folder, args.many)
    shutil.rmtree(args.folder, ignore_errors=True)
    return 0


def many_peers(folder: str, n: int) -> None:
    from freespec.proposers.api import EngineInfo
    from freespec.proposers.suffix_tree import SuffixOptions, SuffixTreeProposer

    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(os.path.join(folder, "suffix"), mode=0o700)
    rng = np.random.default_rng(3)
    for i in range(n):
        peer = ResponseStore(os.path.join(folder, "suffix", f"peer.0.{i}.bin"), fingerprint=FP, vocab_size=VOCAB,
                             perms=state_dir.FILE_MODE)
        for _ in range(30):
            peer.add(rng.integers(0, VOCAB, 50, dtype=np.int32))
        peer.save()
    info = EngineInfo(vocab_size=VOCAB, model="m", tokenizer_fingerprint=lambda: FP, state_dir=folder)
    p = SuffixTreeProposer(SuffixOptions(max_saved_responses=500, max_cached_requests=500), 4)
    wall, cpu = timed(lambda: p.bind(info))
    print(f"start among {n} peer files: wall {wall:.2f} s, cpu {cpu:.2f} s, {p._seeded} responses seeded "
          f"into the tree, {len(p.store)} kept by the store")
    p.close()


if __name__ == "__main__":
    raise SystemExit(main())
