"""Two `vllm serve` processes on one host and one retrieval datastore: each maps it, neither copies it.

Both servers answer the same prompts, whose answers the datastore holds, so both read the same pages of it.
Mapped as designed (numpy.memmap, read-only, MAP_SHARED), the pages are page-cache pages both processes
share: no private dirty pages, and each worker's proportional share (Pss) is about half its resident size.
Two servers take about 2 minutes on 2 cores: marker `long`, run in CI's matrix job.
"""
from __future__ import annotations

import pytest

from freespec.bench.memory import process_tree
from integration_tests.conftest import K, spec_bench_prompts
from integration_tests.serving import metric, start_server

pytestmark = [pytest.mark.integration, pytest.mark.long]


def test_two_servers_share_one_datastore(answers_datastore, model_path, tmp_path):
    from openai import OpenAI

    from freespec.proposers.retrieval.datastore import mapped_residency

    # in_memory_mb 0: mapped even though this datastore is small enough to be read into memory.
    spec = {"plugin": "retrieval", "num_speculative_tokens": K, "datastore": answers_datastore, "in_memory_mb": 0}
    servers = []
    try:
        for i in range(2):  # one after the other: two engines starting at once on 2 cores is only slower
            servers.append(start_server(model_path, spec, tmp_path / f"server{i}.log", memory=0.15))
        for server in servers:
            client = OpenAI(base_url=f"{server.base_url}/v1", api_key="none")
            for prompt in spec_bench_prompts()[:4]:
                client.chat.completions.create(model=model_path, messages=[{"role": "user", "content": prompt}],
                                               max_tokens=96, temperature=0)
            # The datastore holds these answers, so its drafts are accepted.
            assert metric(server, "vllm:spec_decode_num_accepted_tokens_total") > 0

        held = []
        for server in servers:
            mapping = [r for pid in process_tree(server.proc.pid)
                       if (r := mapped_residency(answers_datastore, pid)) and r["mappings"]]
            assert len(mapping) == 1, f"expected one process (the worker) to map the datastore, got {mapping}"
            held.append(mapping[0])
        for r in held:
            assert r["mappings"] == r["shared_mappings"], r  # MAP_SHARED, read-only: page-cache pages
            assert r["Private_Dirty"] == 0, r  # nothing was copied on write
            assert r["Rss"] > 0, r
        # The same pages, counted once: the two proportional shares add up to one resident copy.
        assert sum(r["Pss"] for r in held) <= max(r["Rss"] for r in held) + 65536, held
    finally:
        for server in servers:
            server.stop()
