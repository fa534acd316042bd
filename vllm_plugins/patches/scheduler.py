"""What the two patches of vLLM's scheduler share: a decision kept once per scheduler, and a wrapper that runs
freespec's step before one of ``Scheduler``'s methods and never stops vLLM's own."""
from __future__ import annotations

import functools
import logging

logger = logging.getLogger("freespec")


def decided_once(scheduler, attribute: str, decide) -> bool:
    """``decide(scheduler.vllm_config)``, kept on the scheduler under ``attribute`` so that it runs once per
    engine (a scheduler that takes no attributes decides again next time)."""
    acts = getattr(scheduler, attribute, None)
    if acts is None:
        acts = decide(scheduler.vllm_config)
        try:
            setattr(scheduler, attribute, acts)
        except AttributeError:
            pass
    return acts


def run_before_scheduler_method(name: str, before, patch: str, consequence: str) -> None:
    """Wrap vLLM's ``Scheduler.<name>(request, ...)`` to run ``before(scheduler, request)`` first (idempotent;
    ``before`` looks its function up at each call, so a test can replace it).
    A failure of ``before`` is logged once (``patch`` failed; ``consequence``) and vLLM's method runs as it
    would without freespec."""
    from vllm.v1.core.sched.scheduler import Scheduler

    original = getattr(Scheduler, name)
    if getattr(original, "_freespec", False):
        return
    failed = []

    @functools.wraps(original)
    def wrapper(self, request, *args, **kwargs):
        try:
            before(self, request)
        except Exception as e:
            if not failed:
                failed.append(e)
                logger.warning("freespec: patch %s failed (%r); %s", patch, e, consequence)
        return original(self, request, *args, **kwargs)

    wrapper._freespec = True  # type: ignore[attr-defined]
    setattr(Scheduler, name, wrapper)
