"""Every setting of one benchmark run, with the command line's defaults (``freespec bench --help``)."""
from __future__ import annotations

from dataclasses import dataclass, field

from freespec.bench.configs import DEFAULT_CONFIGS


@dataclass
class BenchOptions:
    questions: str | None = None  # a question.jsonl, "builtin", or None: freespec.questions resolves it
    categories: str | None = None  # comma-separated; None: every category of the file
    per_category: list[int] | None = None  # one count, or one per concurrency level; None: all
    max_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    concurrency: list[int] = field(default_factory=lambda: [1])
    dtype: str | None = None  # None: what fits the machine (freespec.machine.default_dtype)
    model: str | None = None  # None: freespec's prepared model, or the running server's (base_url)
    configs: list[str] = field(default_factory=lambda: [",".join(DEFAULT_CONFIGS)])
    num_speculative_tokens: int = 8
    warmup: int = 4
    out: str | None = None  # None: bench_results/<timestamp>
    port: int | None = None
    max_model_len: int = 4096
    gpu_memory_utilization: float | None = None  # None: server.memory_share (0.3 of RAM on CPU, vLLM's on GPU)
    server_args: str = ""
    server_timeout: float = 900.0
    request_timeout: float = 900.0
    reuse_server: bool = False
    interleave: bool = False  # every config's server up at once, each block run on every config in turn
    repeats: int = 1
    rounds: int = 1
    new_questions_per_level: bool = False
    base_url: str | None = None  # measure this running server instead of starting servers
    label: str | None = None  # the config name of the server at base_url, as the tables show it
    # The workload suite (freespec.bench.workloads): "specbench" (the questions above) or workloads of sessions
    workload: list[str] = field(default_factory=lambda: ["specbench"])
    sessions: int = 4  # sessions per workload
    turns: int = 4  # user turns per session (tool loops: rounds of a call and its result)
    source_chars: int = 3000  # code-edit / tool-loop: a source file trimmed to this many characters
    context_chars: int = 6000  # rag: the document's characters; chat: a conversation's human turns at most
    repeat_traffic: list[str] = field(default_factory=list)  # second passes: same, restart, replica, tenant
    chat_data: str | None = None  # chat: a ShareGPT .json/.jsonl (default: an installed *sharegpt* package's)
