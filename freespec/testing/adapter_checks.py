"""Checks without an engine, through freespec's vLLM adapter: bad options refused at start, and a plugin that
raises or stalls switched off by the circuit breaker while the server keeps decoding.

The adapter (``freespec.vllm_plugins.adapter.FreespecProposer``) is built as vLLM builds it in a worker, from a
stand-in for the vLLM config holding only the fields it reads (``fake_vllm_config``), and called with the
arrays vLLM's ``custom_class`` seam passes each step.
"""
from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any, Optional

import numpy as np

from freespec.testing.plugins import PluginRef, plugin_name


def fake_vllm_config(additional_config: dict, k: int = 4, vocab_size: int = 1000, max_model_len: int = 4096,
                     model: str = "m", tokenizer: Any = None) -> SimpleNamespace:
    """A stand-in for the vLLM config the adapter reads (the fields it uses, nothing else)."""
    return SimpleNamespace(
        additional_config=additional_config,
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(get_vocab_size=lambda: vocab_size, max_model_len=max_model_len, model=model,
                                     tokenizer=tokenizer),
    )


def adapter_for(spec: dict, **config):
    """The adapter vLLM would build for the speculative config ``spec`` (freespec's ``{"plugin": ...}`` spelling,
    through the front-end's checks); ``config``: ``fake_vllm_config``'s model fields (``vocab_size``, ``model``...)."""
    from freespec.vllm_plugins.adapter import FreespecProposer
    from freespec.vllm_plugins.frontend import translate

    _, extra = translate(spec, None)
    return FreespecProposer(fake_vllm_config(extra, spec["num_speculative_tokens"], **config))


def assert_refuses(plugin: PluginRef, options: Mapping[str, Any], field: str, *, k: int = 4,
                   vocab_size: int = 1000, model: str = "m", match: Optional[str] = None) -> str:
    """The server refuses to start with ``options``, and its message names ``field``. Returns the message.

    Two stages run, as at a real start: the front-end's validation of the speculative config (the plugin's
    ``Options``: it must name the field in quotes, ``'field'``, as freespec's messages do), then, if that
    passes, the adapter built in the worker (the plugin's constructor and ``bind``, with ``vocab_size`` and
    ``model`` as the engine's; there the field's name must appear as a word). ``match``: a regular expression
    the message must also match.
    """
    from freespec.vllm_plugins.frontend import FreespecConfigError

    name = plugin_name(plugin)
    spec = {"plugin": name, "num_speculative_tokens": k, **dict(options)}
    try:
        adapter_for(spec, vocab_size=vocab_size, model=model)
    except FreespecConfigError as e:
        message = str(e)
        named = f"'{field}'" in message or f'"{field}"' in message
    except Exception as e:  # raised by the plugin in the worker: the engine does not start
        message = f"{type(e).__name__}: {e}"
        named = re.search(rf"(?<![\w.]){re.escape(field)}(?![\w])", message) is not None
    else:
        raise AssertionError(f"plugin {name!r} accepted options {dict(options)!r}; expected a refusal naming {field!r}")
    assert named, f"plugin {name!r} refused {dict(options)!r} without naming {field!r}: {message}"
    if match is not None:
        assert re.search(match, message), f"the refusal does not match {match!r}: {message}"
    return message


class _Clock:
    """The breaker's clock, moved by hand: its back-off passes without waiting."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _stepper(adapter, tokens: Sequence[int], start: int):
    """One request growing by one token a step over ``tokens``, as vLLM's seam passes it."""
    ids = np.asarray(list(tokens), dtype=np.int32)
    buffer = np.zeros((1, len(ids)), dtype=np.int32)
    buffer[0] = ids
    length = np.array([start], dtype=np.int32)

    def step() -> list[list[int]]:
        length[0] = min(length[0] + 1, len(ids))
        return adapter.propose([[int(ids[length[0] - 1])]], length, buffer)

    return step


def _faulty(draft, mode: str, stall_s: float):
    def faulty(rows, step):
        if mode == "raise":
            raise RuntimeError("freespec.testing: injected fault")
        time.sleep(stall_s)
        return draft(rows, step)

    return faulty


def assert_breaker_engages(plugin: PluginRef, options: Optional[Mapping[str, Any]] = None, *, k: int = 4,
                           tokens: Optional[Sequence[int]] = None, vocab_size: int = 1000, model: str = "m",
                           step_budget_ms: float = 50.0) -> dict:
    """A plugin that raises, or stalls, never stops the server: every step still returns (empty drafts, so vLLM
    decodes plainly), the circuit breaker switches the plugin off within a few steps, and after its back-off
    the plugin, healthy again, drafts again.

    Three runs of one request through the adapter, over ``tokens`` (the request's token ids; default a
    repeating pattern below ``vocab_size``; give text your plugin drafts on): the plugin as it is (it must not
    raise, and its drafts must be at most ``k`` in-vocabulary ids), its ``draft`` raising on every step, and
    its ``draft`` taking 12 x ``step_budget_ms``. Returns the breaker's state after each fault run.
    """
    from freespec.vllm_plugins.breaker import CircuitBreaker

    name = plugin_name(plugin)
    spec = {"plugin": name, "num_speculative_tokens": k, "policy": "fixed", "step_budget_ms": step_budget_ms,
            **dict(options or {})}
    tokens = list(tokens) if tokens is not None else [i % min(vocab_size, 10) for i in range(400)]
    start = max(1, len(tokens) // 4)
    steps = min(len(tokens) - start, 40)
    assert steps >= 12, f"give at least {start + 12} tokens"

    healthy = adapter_for(spec, vocab_size=vocab_size, model=model)
    step = _stepper(healthy, tokens, start)
    for _ in range(steps):
        drafts = step()
        assert len(drafts) == 1 and len(drafts[0]) <= k and all(0 <= t < vocab_size for t in drafts[0]), drafts
    assert healthy.stats.errors == 0, f"plugin {name!r} raised on a healthy run: {healthy.breaker_state()}"

    states = {}
    grace, trip = CircuitBreaker.GRACE_STEPS, CircuitBreaker.TRIP_AFTER
    for mode, most_calls in (("raise", trip), ("stall", grace + 1)):
        adapter = adapter_for(spec, vocab_size=vocab_size, model=model)
        clock = adapter.breaker._clock = _Clock()
        proposer = adapter.proposer
        calls = []
        healthy_draft = proposer.draft

        def counted(rows, step_, draft=_faulty(healthy_draft, mode, 12 * step_budget_ms / 1000)):
            calls.append(1)
            return draft(rows, step_)

        proposer.draft = counted
        step = _stepper(adapter, tokens, start)
        for _ in range(most_calls):  # a slow step's drafts still count; a raising step's cannot
            drafts = step()
            assert mode == "stall" or drafts == [[]], f"plugin {name!r}: a step drafted while the plugin raised"
        state = adapter.breaker_state()
        assert state["state"] == "open", f"plugin {name!r} ({mode}): the breaker did not open: {state}"
        started = time.perf_counter()
        for _ in range(10):
            assert step() == [[]], f"plugin {name!r} ({mode}): a step drafted while the breaker was open"
        assert len(calls) == most_calls, (
            f"plugin {name!r} ({mode}): called {len(calls)} times; the breaker should stop it after {most_calls}")
        assert time.perf_counter() - started < 10 * step_budget_ms / 1000, "the steps after a stall still paid for it"
        states[mode] = state
        # healthy again: after the back-off the trial step runs it, and the breaker closes
        proposer.draft = healthy_draft
        clock.t += state["retry_in_s"] + 0.001
        drafts = step()
        assert len(drafts) == 1 and len(drafts[0]) <= k
        after = adapter.breaker_state()
        assert after["state"] == "closed", f"plugin {name!r} ({mode}): not tried again after its back-off: {after}"
    return states
