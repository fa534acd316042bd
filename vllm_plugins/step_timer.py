"""Named patch ``step_times`` (diagnosis only): where each engine step's time goes, for any speculative method.

Wraps three methods of vLLM's model runner class (seam ``step_times``): ``execute_model`` (the target's forward),
``sample_tokens`` (sampling and verification, with the drafter's call inside it) and ``propose_draft_token_ids``
(the drafter: vLLM's own ``suffix`` or ``ngram`` as much as freespec's adapter). Each step becomes one
``StepTime`` kept in memory, at most ``MAX_STEPS`` (later steps are not kept); nothing is written to a file.

No vLLM a user starts has it: only ``scripts/engine_step_time.py`` installs it, in an engine that runs in the
script's own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), and reads the steps back there. It compares two
drafters that draft the same tokens (results/issue69-zen3): the same steps, so any difference is the path's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

MAX_STEPS = 200_000  # about 20 MB of records; a 40-minute run at 10 ms a step


@dataclass
class StepTime:
    tokens: int  # tokens the step scheduled (all requests: prefill chunks, last tokens and drafts)
    requests: int  # requests in the step
    start: float  # perf_counter() when the forward began
    forward_s: float  # execute_model
    sample_s: float = 0.0  # sample_tokens, the drafter's call included
    draft_s: float = 0.0  # propose_draft_token_ids (0 when nothing was proposed)
    end: float = 0.0  # perf_counter() when sample_tokens returned


class StepTimes:
    """The steps timed so far, in order (``steps``); ``install()`` once per process."""

    def __init__(self) -> None:
        self.steps: list[StepTime] = []
        self._current: StepTime | None = None

    def install(self, runner_cls=None) -> None:
        """Wrap the runner class's three methods (``GPUModelRunner``, which the CPU runner inherits);
        idempotent. The seam is checked first (``probes.probe_step_times``): a moved seam raises here, in the
        script, instead of timing the wrong thing."""
        if runner_cls is None:
            from freespec.vllm_plugins.probes import probe_step_times
            from vllm.v1.worker.gpu_model_runner import GPUModelRunner

            probe = probe_step_times()
            if not probe.ok:
                raise RuntimeError(f"seam step_times moved: {probe.detail}")
            runner_cls = GPUModelRunner
        if getattr(runner_cls.execute_model, "_freespec_step_times", None) is not None:
            return
        execute, sample, propose = runner_cls.execute_model, runner_cls.sample_tokens, runner_cls.propose_draft_token_ids
        timer = self

        def execute_model(runner, scheduler_output, *args, **kwargs):
            start = time.perf_counter()
            out = execute(runner, scheduler_output, *args, **kwargs)
            timer._current = StepTime(int(scheduler_output.total_num_scheduled_tokens),
                                      len(scheduler_output.num_scheduled_tokens), start, time.perf_counter() - start)
            return out

        def sample_tokens(runner, *args, **kwargs):
            start = time.perf_counter()
            out = sample(runner, *args, **kwargs)
            step, timer._current = timer._current, None
            if step is not None and len(timer.steps) < MAX_STEPS:
                step.end = time.perf_counter()
                step.sample_s = step.end - start
                timer.steps.append(step)
            return out

        def propose_draft_token_ids(runner, *args, **kwargs):
            start = time.perf_counter()
            out = propose(runner, *args, **kwargs)
            if timer._current is not None:
                timer._current.draft_s += time.perf_counter() - start
            return out

        execute_model._freespec_step_times = self  # type: ignore[attr-defined]
        runner_cls.execute_model = execute_model
        runner_cls.sample_tokens = sample_tokens
        runner_cls.propose_draft_token_ids = propose_draft_token_ids
