"""The vLLM 0.34 tier: freespec on Model Runner V2's speculator registry, checked with vLLM's own code.

Runs only in the side environment scripts/setup_vllm034.sh builds (``bash scripts/test_vllm034.sh``); anywhere
else every test here is skipped, saying why. CPU only: no engine, no GPU; vLLM's Triton is off there
(``vllm.triton_utils.HAS_TRITON`` is False), so nothing here runs a Triton kernel.
"""
from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(config, items):
    try:
        import vllm
        from freespec.vllm_plugins.version_gate import uses_v2_registry

        version = getattr(vllm, "__version__", "unknown")
        why = None if uses_v2_registry(version) else f"vLLM {version} here runs V1; this tier needs vLLM >= 0.34"
    except Exception as e:  # no vLLM, or one that does not import
        why = f"no importable vLLM >= 0.34 here ({type(e).__name__}: {e}); run bash scripts/test_vllm034.sh"
    if why:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=why))


ROOT = Path(__file__).resolve().parents[1]
FINGERPRINT = "recorded-turns"  # the tokenizer fingerprint of the recorded turns' datastore
VOCAB = 49_152  # the recorded turns' vocabulary (SmolLM2's)


@pytest.fixture(scope="session")
def turns():
    """Recorded greedy agent turns: prompt and output token ids (tests/data/issue69_agent_turns.jsonl)."""
    import json

    path = ROOT / "tests/data/issue69_agent_turns.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="session")
def datastore(turns, tmp_path_factory):
    """A retrieval datastore built by freespec's own builder from the last recorded outputs."""
    import json

    from freespec.proposers.retrieval.build import build_datastore

    root = tmp_path_factory.mktemp("ds")
    corpus = root / "turns.jsonl"
    corpus.write_text("".join(json.dumps({"text": " ".join(map(str, t["output"]))}) + "\n" for t in turns[7:]))
    build_datastore([corpus], root / "ds", lambda texts: [[int(x) for x in t.split()] for t in texts],
                    tokenizer_name="recorded", fingerprint=FINGERPRINT, vocab_size=VOCAB, progress=False)
    return str(root / "ds")
