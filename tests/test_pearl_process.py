"""The pearl draft model in a child process (placement "process"): same drafts, pinning, failures, clean-up."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from freespec.proposers.base import Row, StepContext  # noqa: E402
from freespec.proposers.pearl.proposer import PearlOptions, PearlProposer  # noqa: E402
from pearl_helpers import VOCAB, arr, make, scripted_steps, wait_for_chain  # noqa: E402

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited


def test_process_drafts_like_the_reference_pinned_and_without_the_workers_omp_binding(
    tiny_dir, reference, monkeypatch
):
    """Chains equal uncached greedy ones through rollbacks; post-verify runs in the child between steps."""
    # What vLLM's CPU worker exports for the target's cores: the child must not inherit it.
    monkeypatch.setenv("OMP_PLACES", "{0}")
    monkeypatch.setenv("OMP_PROC_BIND", "true")
    core = max(os.sched_getaffinity(0))
    k = 3
    p = make(tiny_dir, "process", k=k, draft_cores=str(core))
    try:
        pid = p.worker.pid
        assert pid != os.getpid() and p.draft_model is None  # the model lives in the child only
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        assert b"OMP_PLACES" not in env and b"OMP_PROC_BIND" not in env and env[b"OMP_NUM_THREADS"] == b"1"
        for tid in os.listdir(f"/proc/{pid}/task"):  # every thread of the child, OpenMP's included
            assert os.sched_getaffinity(int(tid)) == {core}

        def drafts_like_the_reference(step, key, context, chain):
            assert chain == reference(context, k), (step, key)

        scripted_steps(p, k, reference, steps=6, on_chain=drafts_like_the_reference)
        stats = p.stats()
        assert stats["hits"] > 0 and stats["misses"] > 0 and stats["background_forwards"] > 0
        assert stats["steps"] == 6 and stats["placement"] == "process"
        assert stats["target_wait_ms"] > 0 and stats["draft_idle_ms"] >= 0
        assert p.state_bytes() == stats["weight_bytes"] + stats["kv_bytes"] > 0
        p.release(0)
        p.propose([Row(1, arr([9, 1, 70]), 1)])
        assert p.wait_idle() and p.stats()["cached_requests"] == 1  # release reached the child
        # An exception in the child's drafter reaches the caller; the child resets and goes on.
        with pytest.raises(RuntimeError, match="pearl draft process"):
            p.propose([Row(2, arr([VOCAB + 50, 1]), 1)])  # an id the embedding does not have
        assert p.propose([Row(0, arr([1, 2, 3]), 1)])[0] == reference([1, 2, 3], k)
        # the load-aware bar reaches the child: a tiny random model is never that sure
        assert p.propose([Row(3, arr([4, 5, 6]), 1)], StepContext(token_cost=1.0)) == [[]]
        assert p.stats()["policy_cut_tokens"] == k
        assert p.worker.pid == pid and p.stats()["deaths"] == 0
    finally:
        p.close()
    assert not alive(pid)


def test_killed_or_hung_child_drafts_nothing_then_restarts(tiny_dir, reference, caplog):
    p = make(tiny_dir, "process", k=2, step_timeout_s=1.0)
    try:
        ctx = [1, 2, 3]
        assert p.propose([Row(0, arr(ctx), 1)])[0] == reference(ctx, 2)
        first = p.worker.pid
        os.kill(first, signal.SIGKILL)
        t0 = time.monotonic()
        assert p.propose([Row(0, arr(ctx + [4]), 1)]) == [[]]  # no exception, no wait
        assert time.monotonic() - t0 < 2
        assert wait_for_chain(p, Row(0, arr(ctx + [4]), 1)) == reference(ctx + [4], 2)
        second = p.worker.pid
        assert second != first
        # A child that stops answering: the step gives up after step_timeout_s and kills it.
        os.kill(second, signal.SIGSTOP)
        t0 = time.monotonic()
        assert p.propose([Row(0, arr(ctx + [4, 5]), 1)]) == [[]]
        assert 1.0 <= time.monotonic() - t0 < 5
        assert not alive(second)
        assert wait_for_chain(p, Row(0, arr(ctx + [4, 5]), 1)) == reference(ctx + [4, 5], 2)
        stats = p.stats()
        assert stats["deaths"] == 2 and stats["restarts"] == 2 and stats["skipped_steps"] >= 2
        assert stats["steps"] >= 3  # counters of the dead children are kept
        assert sum("restarting the draft process" in r.getMessage() for r in caplog.records) == 1  # logged once
        # Out of restarts: pearl stays off and steps return at once.
        p.worker.max_restarts = p.worker.restarts
        os.kill(p.worker.pid, signal.SIGKILL)
        for _ in range(3):
            assert p.propose([Row(0, arr(ctx + [4, 5]), 1)]) == [[]]
        assert p.worker.pid is None
    finally:
        p.close()


def test_a_draft_model_that_fails_to_load_in_the_child_is_refused_naming_it(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama", "vocab_size": 10}')
    with pytest.raises(ValueError, match=r"option 'draft_model'.*cannot be loaded in the draft process"):
        PearlProposer(PearlOptions(draft_model=str(tmp_path), placement="process"), 4)


def test_the_child_exits_when_its_parent_dies(tiny_dir, tmp_path):
    """No orphan: a parent killed without close() leaves a child that exits on the pipe's EOF."""
    script = textwrap.dedent(f"""
        import os, sys
        from freespec.proposers.pearl.proposer import PearlOptions, PearlProposer
        p = PearlProposer(PearlOptions(draft_model={tiny_dir!r}, placement="process"), 2)
        print(p.worker.pid, flush=True)
        sys.stdin.read()
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert alive(child)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child)
    finally:
        if parent.poll() is None:
            parent.kill()
