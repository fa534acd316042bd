"""pearl with ``placement: "ray"`` on the real vLLM CPU engine: the draft model in a Ray actor.

The test starts a Ray head on 127.0.0.1 (as a KubeRay or ``ray start --head`` node would have one) and
hands its address to the plugin through the ``ray_address`` option, the only way it reaches vLLM's
worker. The worker (inside vLLM's engine-core process; vLLM's own executor stays ``uni`` on the CPU)
joins that cluster and creates the draft actor, which Ray runs in one of its own worker processes.
SmolLM2 drafts for itself, as in test_pearl_engine.py: the greedy text must be the text without
speculation and most output tokens must come from accepted drafts.

What this does not show: another node. The cluster here is one machine; Ray places the actor on a node
the same way whatever the number of nodes (docs/pearl.md).
"""
from __future__ import annotations

import os
import re

import pytest

from integration_tests.conftest import K, PEARL_SYNC, assert_accepted_share, assert_lossless_greedy, greedy_jobs

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


@pytest.fixture(scope="module")
def ray_head():
    """A local Ray head on 127.0.0.1; its GCS address, which another process on the machine can join."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing outside this machine is contacted
    ctx = ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
                   object_store_memory=100 << 20)
    try:
        yield ctx.address_info["gcs_address"]
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def pearl_ray_run(engines, model_path, ray_head):
    spec = {"plugin": "pearl", "num_speculative_tokens": K, "draft_model": model_path, **PEARL_SYNC,
            "placement": "ray", "ray_address": ray_head}
    return engines.run("pearl_ray", spec, greedy_jobs())


def test_the_draft_ran_in_a_ray_actor_of_the_given_cluster(pearl_ray_run, ray_head):
    _, log = pearl_ray_run
    started = re.findall(r"freespec: pearl draft runs in Ray actor (\w+) on node (\S+) \(.*, pid (\d+)\)", log)
    assert len(started) == 1, log[-5000:]  # one actor, never restarted
    actor_id, node_ip, pid = started[0]
    assert node_ip == ray_head.rpartition(":")[0]  # a node of the test's cluster
    worker_pids = set(re.findall(r"\(EngineCore\S* pid=(\d+)\)", log))
    assert worker_pids and pid not in worker_pids, (pid, worker_pids)  # not vLLM's worker process
    assert "restarting the draft actor" not in log, log[-5000:]
    print(f"pearl ray: actor {actor_id} on {node_ip}, pid {pid}; vLLM's engine core pid {sorted(worker_pids)}")


def test_pearl_ray_greedy_text_matches_no_speculation(pearl_ray_run, baseline):
    assert_lossless_greedy(baseline, pearl_ray_run[0])


def test_pearl_ray_self_drafts_are_accepted(pearl_ray_run):
    assert_accepted_share(pearl_ray_run[0], 0.6)
    greedy = pearl_ray_run[0]["greedy"]
    accepted = greedy["spec"].get("vllm:spec_decode_num_accepted_tokens", 0)
    print(f"pearl ray: {accepted} accepted draft tokens for {sum(len(t) for t in greedy['token_ids'])} output "
          f"tokens; greedy job {greedy['seconds']:.1f} s")
