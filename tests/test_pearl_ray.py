"""The pearl draft model in a Ray actor (placement "ray"), on a local Ray started here: same drafts as the
process placement, another process, an actor killed or hung drafts nothing and comes back, option errors."""
import os
import signal
import sys
import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ray = pytest.importorskip("ray")

from pydantic import ValidationError  # noqa: E402

from freespec.proposers.base import Row  # noqa: E402
from freespec.proposers.pearl.proposer import PearlOptions  # noqa: E402
from pearl_helpers import VOCAB, arr, make, scripted_steps, wait_for_chain  # noqa: E402
from freespec.vllm_plugins.frontend import FreespecConfigError, translate, validate_options  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing outside this machine is contacted
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=80 << 20,
             log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def test_the_actor_drafts_what_the_process_drafts_and_survives_being_killed_or_hung(
    tiny_dir, reference, local_ray, caplog
):
    """One proposer through it all: each actor start costs a Ray worker importing torch (seconds of CPU)."""
    k = 3
    process = make(tiny_dir, "process", k=k)
    try:
        expected = scripted_steps(process, k, reference)
    finally:
        process.close()
    p = make(tiny_dir, "ray", k=k)
    try:
        info = p.worker.info
        assert p.draft_model is None and info["pid"] != os.getpid() and info["ray_actor_id"]
        assert scripted_steps(p, k, reference) == expected
        stats = p.stats()
        assert stats["placement"] == "ray" and stats["steps"] == 5 and stats["deaths"] == 0
        assert stats["hits"] > 0 and stats["misses"] > 0 and stats["background_forwards"] > 0
        assert p.state_bytes() == stats["weight_bytes"] + stats["kv_bytes"] > 0
        p.release(0)  # no reply awaited: it reaches the actor before the next call
        p.propose([Row(1, arr([9, 1, 70]), 1)])
        assert p.wait_idle() and p.stats()["cached_requests"] == 1
        # An exception in the actor's drafter reaches the caller; the actor resets and goes on.
        with pytest.raises(RuntimeError, match="pearl draft actor"):
            p.propose([Row(2, arr([VOCAB + 50, 1]), 1)])
        ctx = [5, 17, 33, 2]
        assert p.propose([Row(0, arr(ctx), 1)])[0] == expected[0][0]
        assert p.worker.info["pid"] == info["pid"] and p.stats()["deaths"] == 0

        # A killed actor: that step drafts nothing at once, a new actor comes back in the background.
        ray.kill(p.worker._actor)
        # ray.kill only asks: until the process is gone the actor may still answer (a CI run drafted a chain).
        assert gone(info["pid"])
        t0 = time.monotonic()
        assert p.propose([Row(0, arr(ctx), 1)]) == [[]]  # no exception, no hang
        assert time.monotonic() - t0 < 5
        assert wait_for_chain(p, Row(0, arr(ctx), 1)) == expected[0][0]
        second = p.worker.info
        assert second["ray_actor_id"] != info["ray_actor_id"]
        # An actor that stops answering: the step gives up after step_timeout_s, the actor is killed.
        p.worker.step_timeout_s = 1.0
        os.kill(second["pid"], signal.SIGSTOP)
        t0 = time.monotonic()
        assert p.propose([Row(0, arr(ctx), 1)]) == [[]]
        assert 1.0 <= time.monotonic() - t0 < 5
        assert wait_for_chain(p, Row(0, arr(ctx), 1)) == expected[0][0]
        assert gone(second["pid"])  # ended, not left stopped
        stats = p.stats()
        assert stats["deaths"] == 2 and stats["restarts"] == 2 and stats["skipped_steps"] >= 2
        assert stats["steps"] >= 9  # counters of the dead actors are kept
        assert sum("restarting the draft actor" in r.getMessage() for r in caplog.records) == 1  # logged once
        # Out of restarts: pearl stays off and steps return at once.
        p.worker.max_restarts = p.worker.restarts
        last = p.worker.info
        ray.kill(p.worker._actor)
        assert gone(last["pid"])
        for _ in range(3):
            assert p.propose([Row(0, arr(ctx), 1)]) == [[]]
        assert p.worker.pid is None
    finally:
        p.close()


def gone(pid, seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_option_errors_name_the_field(tiny_dir, monkeypatch):
    def refused(match, **options):
        with pytest.raises(ValidationError, match=match):
            PearlOptions(draft_model=tiny_dir, **options)

    refused("'draft_cores' cannot be used with placement \"ray\".*ray_actor_options", placement="ray",
            draft_cores="0")
    refused("ray_actor_options\n.*num_cpus must be a number", placement="ray", ray_actor_options={"num_cpus": -1})
    refused("option 'ray_actor_options': Invalid option keyword num_cpu", placement="ray",
            ray_actor_options={"num_cpu": 1})
    refused("resources must map", placement="ray", ray_actor_options={"resources": {"node:x": "a"}})
    refused("option 'device' is 'cuda:1', but the draft actor gets 1 GPU", placement="ray", device="cuda:1")
    refused("option 'ray_address' is only used with placement \"ray\"", ray_address="127.0.0.1:6379")
    refused("option 'ray_actor_options' is only used", placement="thread", ray_actor_options={"num_cpus": 1})
    PearlOptions(draft_model=tiny_dir, placement="ray", device="cuda:1", ray_actor_options={"num_gpus": 2})
    # The options travel in vLLM's config as a full dump and the worker validates them again.
    actor = {"num_cpus": 2, "resources": {"node:10.0.0.5": 0.01}}
    _, extra = translate({"plugin": "pearl", "num_speculative_tokens": 4, "draft_model": tiny_dir,
                          "placement": "ray", "ray_address": "10.0.0.1:6379", "ray_actor_options": actor}, None)
    again = validate_options("pearl", extra["freespec"]["options"])
    assert (again.ray_address, again.ray_actor_options) == ("10.0.0.1:6379", actor)
    with pytest.raises(FreespecConfigError, match="option 'draft_cores' cannot be used with placement"):
        translate({"plugin": "pearl", "num_speculative_tokens": 4, "draft_model": tiny_dir, "placement": "ray",
                   "draft_cores": "0"}, None)
    # Nobody answers at the address: refused at once, naming it (ray.init itself would wait for minutes).
    from freespec.proposers.pearl.ray import reachable

    t0 = time.monotonic()
    with pytest.raises(ValueError, match="option 'ray_address' .*no Ray cluster answers at 127.0.0.1:1"):
        reachable("127.0.0.1:1")
    assert time.monotonic() - t0 < 5
    # Ray not installed: the error names placement and the extra to install.
    monkeypatch.setitem(sys.modules, "ray", None)
    refused(r"option 'placement' is \"ray\", but Ray is not installed.*vllm-freespec\[cluster\]", placement="ray")
    from freespec.proposers.pearl.ray import import_ray

    with pytest.raises(ValueError, match=r"'placement' is \"ray\".*vllm-freespec\[cluster\]"):
        import_ray()
