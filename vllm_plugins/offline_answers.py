"""The target model's own greedy answers to a list of prompts, with an offline vLLM ``LLM``.

``freespec responses build`` stores them as a response store file (``proposers.learned.response_store``), which the
``suffix`` source loads at start (``responses_path``): a new server then drafts from its model's own phrasing
from its first request, as one that has already served that traffic would. vLLM's offline API only
(``LLM``, ``SamplingParams``, ``LLM.chat``, ``LLM.get_tokenizer``, ``LLM.llm_engine.model_config``); the
tokenizer's identity is the one the plugin checks when it loads the file
(``vllm_plugins.adapter.tokenizer_fingerprint``). Memory: the prompts and every answer's token ids, at most
``len(prompts) * max_tokens`` ids, until the caller stores them.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Answers:
    """The answers (output token ids, in the order of the prompts that fit), their prompts' token ids (the chat
    template applied, as the engine saw them) and what a response store file must record."""

    outputs: list[list[int]]
    prompts: list[list[int]]
    vocab_size: int
    fingerprint: str


def greedy_answers(
    model: str,
    prompts: Sequence[str],
    *,
    max_tokens: int,
    dtype: str,
    max_model_len: int,
    log: Callable[[str], None],
    memory: float | None = None,
) -> Answers:
    """Answer every prompt (one user turn, the model's chat template) greedily, batched by vLLM, with a progress bar.

    A prompt whose templated tokens plus ``max_tokens`` exceed ``max_model_len`` is skipped (logged with a count).
    ``memory``: vLLM's ``gpu_memory_utilization`` (None: vLLM's default).
    """
    # One process: the caller's top level need not be spawn-safe, and the engine's memory is this process's.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM, SamplingParams

    from freespec.vllm_plugins.adapter import tokenizer_fingerprint

    extra = {} if memory is None else {"gpu_memory_utilization": memory}
    llm = LLM(model=model, dtype=dtype, max_model_len=max_model_len, seed=0, **extra)
    tokenizer = llm.get_tokenizer()
    room = max_model_len - max_tokens

    def length(prompt: str) -> int:  # rendered, then encoded: as the engine counts a chat prompt's tokens
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                             tokenize=False)
        return len(tokenizer.encode(text, add_special_tokens=False))

    kept = [p for p in prompts if length(p) <= room]
    skipped = len(prompts) - len(kept)
    if skipped:
        log(f"{skipped} of {len(prompts)} prompts skipped: longer than max_model_len {max_model_len} "
            f"less max_tokens {max_tokens}")
    outs = llm.chat([[{"role": "user", "content": p}] for p in kept],
                    SamplingParams(max_tokens=max_tokens, temperature=0.0), use_tqdm=True)
    model_config = llm.llm_engine.model_config
    return Answers(
        outputs=[list(o.outputs[0].token_ids) for o in outs],
        prompts=[list(o.prompt_token_ids) for o in outs],
        vocab_size=int(model_config.get_vocab_size()),
        fingerprint=tokenizer_fingerprint(model_config.tokenizer),
    )
