"""vLLM replicas as actors of a local Ray cluster, the way Ray Serve and KubeRay deployments run them: shared
by the ``cluster`` tests test_ray_replicas.py (recycle's matrices through the object store) and
test_ray_state_dir.py (hybrid's responses through one state directory).

Each actor builds a whole ``vllm.LLM`` (vLLM's own Ray executor refuses the CPU platform, and a replica with
one worker does not use it anyway) with a freespec plugin in ``speculative_config``; the plugin and its
options reach each replica's engine only through the entry point and the config. One core per replica.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager

import pytest

from integration_tests.conftest import REPO
from freespec.testing.lossless import greedy_mismatches

TOKENS = 48  # shorter than the baseline's 96: its first 48 tokens are compared


@contextmanager
def local_cluster():
    """A Ray cluster of this machine with two CPUs (one per replica); skips the test where Ray is missing."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing outside this machine is contacted
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             object_store_memory=100 << 20, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    try:
        yield ray
    finally:
        ray.shutdown()


def start_replicas(ray, cls, args: list[tuple]) -> list:
    """One actor of ``cls`` per entry of ``args`` (its constructor's arguments before the core), replica
    ``i`` on core ``i``; they start at once."""
    actor = ray.remote(num_cpus=1)(cls)
    return [actor.remote(*a, str(i)) for i, a in enumerate(args)]


class Replica:
    """One vLLM engine with freespec inside a Ray actor (a Ray Serve replica, minus the HTTP)."""

    def __init__(self, model: str, spec: dict, core: str) -> None:
        # One core per replica (Ray sets OMP_NUM_THREADS=1 for a one-CPU actor); read by vLLM's CPU worker.
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = core
        from vllm import LLM

        started = time.monotonic()
        self.llm = LLM(
            model=model, dtype="float32", speculative_config=spec, max_model_len=2048, enforce_eager=True,
            disable_log_stats=False, seed=0, kv_cache_memory_bytes=256 << 20,
        )
        self.start_seconds = time.monotonic() - started
        self.rendered: dict[str, list[int]] = {}  # chat text -> the prompt tokens vLLM's chat gave it here

    def generate(self, prompts: list[str], salt: str | None = None) -> dict:
        """Greedy answers to ``prompts`` (user messages), TOKENS each, and the spec-decode counters they
        moved. With ``salt``: as that tenant's requests (``cache_salt``). vLLM's ``chat`` takes no salt, so
        such a prompt goes in as the tokens ``chat`` gave it here before (served unsalted first)."""
        from vllm import SamplingParams

        from freespec.testing.engine_run import spec_counters

        params = SamplingParams(max_tokens=TOKENS, temperature=0.0)
        before = spec_counters(self.llm)
        if salt is None:
            chats = [[{"role": "user", "content": p}] for p in prompts]
            outputs = self.llm.chat(chats, params, use_tqdm=False)
            self.rendered.update((p, list(o.prompt_token_ids)) for p, o in zip(prompts, outputs))
        else:
            salted = [{"prompt_token_ids": self.rendered[p], "cache_salt": salt} for p in prompts]
            outputs = self.llm.generate(salted, params, use_tqdm=False)
        after = spec_counters(self.llm)
        return {
            "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            "spec": {k: after[k] - before.get(k, 0) for k in after},
            "start_seconds": self.start_seconds,
        }

    def tick(self, seconds: float, prompt: str, salt: str, tokens: int) -> list[int]:
        """Keep the engine stepping for ``seconds``, one short request of ``salt``'s after another: a plugin's
        periodic work (saves, merges) and the release of the requests that finished in the last step happen
        only in steps. Returns the last request's output tokens."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=tokens, temperature=0.0)
        end = time.monotonic() + seconds
        while True:
            out = self.llm.generate([{"prompt": prompt, "cache_salt": salt}], params, use_tqdm=False)
            if time.monotonic() >= end:
                return list(out[0].outputs[0].token_ids)

    def close(self) -> None:
        """Stop the engine (its engine-core process) before Ray kills this actor's process."""
        import gc

        del self.llm
        gc.collect()


def accepted_per_token(result: dict) -> float:
    tokens = sum(len(t) for t in result["token_ids"])
    return result["spec"].get("vllm:spec_decode_num_accepted_tokens", 0) / tokens


def assert_plain_text(baseline, indices, got) -> None:
    """The greedy text of the baseline's prompts ``indices`` is the plain engine's, but on a numerical tie."""
    base = baseline["greedy"]
    problems = greedy_mismatches(
        [base["token_ids"][i][:TOKENS] for i in indices], [base["top_logprobs"][i][:TOKENS] for i in indices],
        got,
    )
    assert not problems, "\n".join(problems)
