"""Retrieval drafting: suffix-array queries, chain fusion, the proposer over a small datastore."""
import json

import numpy as np
import pytest
from pydantic import ValidationError

from freespec.proposers.base import EngineInfo, Row, StepContext
from freespec.proposers.retrieval.datastore import FORMAT, SEPARATOR, VERSION, Datastore, DatastoreError, file_sha256
from freespec.proposers.retrieval.proposer import RetrievalOptions, RetrievalProposer
from freespec.proposers.retrieval.search import continuations, longest_match, sa_range
from freespec.scorers.calibration import TokenCalibration
from freespec.proposers.api import Candidates, descend
from freespec.scorers.fusion import SourceWeights, fuse

FP = "sha256:test"


def naive_sa(tokens: np.ndarray) -> np.ndarray:
    return np.array(sorted(range(len(tokens)), key=lambda i: tokens[i:].tolist()), dtype=np.uint32)


def write_store(path, docs: list[list[int]], shards: int = 1, fingerprint: str = FP):
    path.mkdir(parents=True, exist_ok=True)
    entries, total = [], 0
    per = -(-len(docs) // shards)
    for s in range(shards):
        part = docs[s * per : (s + 1) * per]
        toks = np.array([t for d in part for t in list(d) + [int(SEPARATOR)]], dtype="<u4")
        name = f"shard-{s:05d}"
        toks.tofile(path / f"{name}.tokens")
        naive_sa(toks).astype("<u4").tofile(path / f"{name}.sa")
        entries.append(
            {
                "name": name,
                "tokens": len(toks),
                "tokens_sha256": file_sha256(path / f"{name}.tokens"),
                "sa_sha256": file_sha256(path / f"{name}.sa"),
            }
        )
        total += len(toks)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "tokenizer": {"name": "test", "fingerprint": fingerprint},
        "vocab_size": 200_000,
        "separator": int(SEPARATOR),
        "shards": entries,
        "total_tokens": total,
        "documents": len(docs),
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    return str(path)


def test_sa_range_and_longest_match_agree_with_brute_force():
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 5, size=400).astype(np.uint32)
    tokens[::37] = 100_000  # ids beyond 16 bits
    sa = naive_sa(tokens)
    for _ in range(50):
        m = int(rng.integers(1, 5))
        start = int(rng.integers(0, 400 - m))
        pattern = tokens[start : start + m].copy()
        lo, hi = sa_range(tokens, sa, pattern)
        hits = sorted(int(p) for p in sa[lo:hi])
        brute = [i for i in range(400 - m + 1) if np.array_equal(tokens[i : i + m], pattern)]
        assert hits == brute
    context = np.concatenate([rng.integers(0, 5, 30), tokens[200:207]]).astype(np.uint32)
    m, lo, hi = longest_match(tokens, sa, context, 2, 12)
    assert m >= 7 and hi > lo
    assert all(np.array_equal(tokens[int(p) : int(p) + m], context[-m:]) for p in sa[lo:hi])
    m, lo, hi = longest_match(tokens, sa, np.array([7, 8, 9], np.uint32), 2, 12)
    assert m == 0  # 7, 8, 9 never occur


def test_continuations_are_sampled_evenly_and_stop_at_document_ends():
    docs = [[1, 2, 3, 4, 5], [1, 2, 9]] * 3
    toks = np.array([t for d in docs for t in d + [int(SEPARATOR)]], dtype=np.uint32)
    sa = naive_sa(toks)
    lo, hi = sa_range(toks, sa, np.array([1, 2], np.uint32))
    assert hi - lo == 6
    conts = continuations(toks, sa, lo, hi, 2, 4, 4, SEPARATOR)
    assert conts.shape == (4, 4)
    rows = {tuple(r) for r in conts.tolist()}
    assert rows <= {(3, 4, 5, -1), (9, -1, -1, -1)}


def test_fuse_follows_the_majority_and_stops_where_support_falls():
    chains = np.array([[5, 6, 7], [5, 6, 8], [5, 9, -1], [4, 1, 1]])
    # Support is conditional: the share of the chains still on the draft's path (3 of 4 go on with 5; of
    # those, 2 of 3 with 6; of those, 1 of 2 with 7 or 8).
    draft, support, supported = fuse([Candidates("r", chains, np.ones(4))], 3, 0.6)
    assert draft == [5, 6] and support == pytest.approx([0.75, 2 / 3]) and supported == {"r": 2}
    draft, support, _ = fuse([Candidates("r", chains, np.ones(4))], 3, 0.4)
    assert draft == [5, 6, 7] and support == pytest.approx([0.75, 2 / 3, 0.5])  # a tie: the smaller token
    # The request's own context agrees with the minority: together they win at depth 2.
    copy = Candidates("copy", np.array([[5, 6, 8, 3]]), np.ones(1), source_weight=0.5)
    draft, _, supported = fuse([Candidates("r", chains, np.ones(4)), copy], 4, 0.4)
    assert draft == [5, 6, 8, 3] and supported == {"r": 3, "copy": 4}
    assert fuse([], 4, 0.1)[0] == []


def test_calibrated_chains_are_weighed_by_their_learned_chance_and_the_descent_is_the_majority():
    chains = np.array([[5, 6, 7], [5, 6, 8], [5, 9, -1], [4, 1, 1]])
    calibration = TokenCalibration()
    found = Candidates("r", chains, np.ones(4), calibration=calibration, match_len=12)
    assert descend(found, 3) == ([5, 6, 7], pytest.approx([0.75, 2 / 3, 0.5])) == found.descent
    draft, support, _ = fuse([found], 3, 0.0)
    assert draft == [5, 6, 7]
    assert support == pytest.approx([calibration.chance(share, 12, depth) for depth, share in enumerate([0.75, 2 / 3, 0.5])])
    # Learning that tokens found by a 12-token match are always right raises the chance of each one.
    before = calibration.chance(0.75, 12, 0)
    for _ in range(50):
        calibration.observe(TokenCalibration.cells([0.75, 2 / 3, 0.5], 12), 3, 3)
    assert calibration.chance(0.75, 12, 0) > max(before, 0.95)
    assert calibration.chance(0.75, 2, 0) == TokenCalibration().chance(0.75, 2, 0)  # another match length's cell
    # A source whose chance (here calibrated) is higher wins over one that disagrees with a lower one.
    suffix = Candidates("suffix", np.array([[5, 9, 4]]), np.ones(1), token_probs=np.array([[0.9, 0.6, 0.6]]))
    draft, _, supported = fuse([found, suffix], 3, 0.05)
    assert draft == [5, 6, 7] and supported == {"r": 3, "suffix": 1}


def test_the_retrieval_source_learns_the_chance_of_its_tokens_from_what_the_target_produced(tmp_path):
    """Served as hybrid's source: its chain at one step is scored at the next against the tokens produced."""
    p = make(tmp_path, [[1, 2, 3, 4, 5, 6]], fuse_copy=False)
    (found,) = p.candidates([Row(key=0, tokens=np.array([9, 1, 2, 3]), num_new=1)])
    assert found.match_len == 3 and found.calibration is p.calibration
    cells = TokenCalibration.cells([1.0, 1.0], 3)
    before = p.calibration.estimate(cells)
    p.candidates([Row(key=0, tokens=np.array([9, 1, 2, 3, 4, 7]), num_new=2)])  # 4 right, then 7 not 5
    after = p.calibration.estimate(cells)
    assert after[0] > before[0] and after[1] < before[1]
    p.release(0)
    assert not p._chains


def test_source_weights_learn_acceptance():
    w = SourceWeights()
    for _ in range(40):
        w.observe({"good": 3}, 3)
        w.observe({"bad": 3, "good": 1}, 1)  # the draft's first token came from both; "bad" went on wrongly
    assert w.weight("good") > 0.9 and w.weight("bad") < 0.55


def make(tmp_path, docs, k=4, shards=1, **opts):
    path = write_store(tmp_path / "store", docs, shards)
    p = RetrievalProposer(RetrievalOptions(datastore=path, **opts), k)
    p.bind(EngineInfo(vocab_size=200_000, tokenizer_fingerprint=lambda: FP))
    return p


def row(key, tokens, num_new=1):
    return Row(key, np.asarray(tokens, dtype=np.int32), num_new)


@pytest.mark.parametrize("shards", [1, 3])
def test_proposer_drafts_what_followed_in_the_datastore(tmp_path, shards):
    docs = [[10, 11, 12, 13, 14, 15]] * 4 + [[10, 11, 12, 99, 98]] + [[50, 51, 52]] * 3
    p = make(tmp_path, docs, shards=shards, fuse_copy=False)
    drafts = p.propose([row(0, [7, 10, 11, 12]), row(1, [7, 8]), row(2, [1, 2, 3], num_new=0)])
    assert drafts[0] == [13, 14, 15]  # 4 of 5 occurrences; the separator ends the chain
    assert drafts[1] == [] and drafts[2] == []


def test_proposer_fuses_with_the_request_context(tmp_path):
    p = make(tmp_path, [[60, 61, 62]] * 3, fuse_copy=True)
    ctx = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]  # copy knows 4, 5, 6, 7 follows "1 2 3"; the datastore knows nothing
    assert p.propose([row(0, ctx)])[0][:2] == [4, 5]


def test_refusals(tmp_path):
    path = write_store(tmp_path / "other", [[1, 2, 3]], fingerprint="sha256:another")
    p = RetrievalProposer(RetrievalOptions(datastore=path), 4)
    with pytest.raises(DatastoreError, match="another tokenizer"):
        p.bind(EngineInfo(vocab_size=10, tokenizer_fingerprint=lambda: FP))
    with pytest.raises(ValidationError, match="does not exist"):
        RetrievalOptions(datastore=str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValidationError, match="no manifest.json"):
        RetrievalOptions(datastore=str(tmp_path / "empty"))
    path = write_store(tmp_path / "cut", [[1, 2, 3, 4]])
    with open(f"{path}/shard-00000.tokens", "r+b") as f:
        f.truncate(8)
    with pytest.raises(DatastoreError, match="truncated"):
        Datastore.open(path, FP)



def test_the_context_source_takes_its_own_options_and_a_bad_one_is_refused_naming_it(tmp_path):
    from freespec.proposers.copy import CopyOptions
    from freespec.vllm_plugins.frontend import FreespecConfigError, validate_options

    store = write_store(tmp_path / "store", [[1, 2, 3]])
    p = RetrievalProposer(RetrievalOptions(datastore=store, copy={"min_match": 4}), 4)
    assert p.copy.options.min_match == 4
    assert RetrievalProposer(RetrievalOptions(datastore=store), 4).copy.options == CopyOptions()
    with pytest.raises(FreespecConfigError, match=r"plugin 'retrieval': option 'copy\.min_match': .*greater"):
        validate_options("retrieval", {"datastore": store, "copy": {"min_match": 0}})
    with pytest.raises(ValidationError, match='"copy" options are given but "fuse_copy" is off'):
        RetrievalOptions(datastore=store, fuse_copy=False, copy={"min_match": 4})


def test_under_a_bar_the_datastore_cannot_clear_it_is_not_searched(tmp_path, monkeypatch):
    p = make(tmp_path, [[10, 11, 12, 13, 14, 15]] * 4, fuse_copy=False)
    for _ in range(30):
        p.weights.observe({"retrieval": 3}, 0)  # its drafts keep being rejected
    searched = []
    original = p.lookup
    monkeypatch.setattr(p, "lookup", lambda tokens: searched.append(1) or original(tokens))
    assert p.propose([row(0, [7, 10, 11, 12])], StepContext(token_cost=0.5)) == [[]] and not searched
    p.propose([row(0, [7, 10, 11, 12])], StepContext(token_cost=0.01))  # a bar it can clear: searched again
    assert searched


def test_binding_asks_the_kernel_to_read_the_datastore_ahead(tmp_path, monkeypatch):
    import os

    advised = []
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, offset, length, advice: advised.append(advice))
    make(tmp_path, [[10, 11, 12, 13], [14, 15]], shards=2, in_memory_mb=0)  # mapped: the page cache is what it reads
    assert advised == [os.POSIX_FADV_WILLNEED] * 4  # tokens and suffix array of each shard
    advised.clear()
    make(tmp_path / "again", [[10, 11, 12, 13], [14, 15]], shards=2)  # read into memory at start: nothing to advise
    assert advised == []


def test_binding_runs_both_search_kernels_once_so_the_first_step_does_not_load_them(tmp_path, monkeypatch):
    from freespec.proposers.retrieval import search

    calls = []
    for name in ("longest_match", "continuations"):
        kernel = getattr(search, name)
        monkeypatch.setattr(search, name,
                            lambda *args, _kernel=kernel, _name=name: calls.append(_name) or _kernel(*args))
    p = make(tmp_path, [[10, 11, 12, 13, 14, 15]] * 2, shards=1)
    assert calls == ["longest_match", "continuations"]  # a lookup of the datastore's own first tokens
    calls.clear()
    assert p.propose([row(0, [7, 10, 11, 12])]) == [[13, 14, 15]]
    assert "longest_match" in calls


def test_checking_a_retrieval_config_loads_no_numba(tmp_path):
    # The front-end checks the options in vLLM's API server and, for an in-process engine, in the process that
    # then runs the worker: numba loaded there broke forked workers, and vLLM 0.32's CPU kernel registration.
    import subprocess
    import sys

    write_store(tmp_path / "ds", [[1, 2, 3, 4]])
    code = ("import sys; from freespec.proposers.retrieval import RetrievalOptions; "
            f"RetrievalOptions(datastore={str(tmp_path / 'ds')!r}); "
            "from freespec.proposers.retrieval.proposer import RetrievalProposer; "
            "print('numba' in sys.modules, 'llvmlite' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr[-2000:]
