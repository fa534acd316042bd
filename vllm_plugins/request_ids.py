"""Request identity: each batch row's vLLM request id, read from the model runner's input batch.

The ``custom_class`` seam passes no ids, but its caller is the model runner's ``propose_draft_token_ids``,
whose ``self.input_batch`` holds ``token_ids_cpu`` (the very array passed) and ``req_ids`` in the same row
order. The batch is found once through the caller's frame and then reused while it still holds that array;
anything unexpected (another vLLM, another caller, ids missing or repeated) gives None, and the adapter
tells requests apart by their tokens instead (``request_tracker.RequestTracker``), with one log line.
Named patch ``request_ids`` (``patches.PATCHES``, probe ``request_ids``): ``FREESPEC_DISABLE_PATCHES=request_ids``
leaves vLLM's frames alone, and requests are told apart by their tokens.
"""
from __future__ import annotations

import logging

from freespec import settings

logger = logging.getLogger("freespec")


class BatchRequestIds:
    """Reads the engine's request id of each row; ``read`` gives None where they cannot be read."""

    def __init__(self) -> None:
        self._batch = None  # vLLM's input batch, once found
        self._warned = False
        self.off = "request_ids" in settings.disabled_patches()

    def read(self, caller, token_ids_cpu, n_rows: int) -> list[str] | None:
        """The ids of the first ``n_rows`` rows; ``caller``: the frame that called the seam's ``propose``."""
        if self.off:
            return None
        batch = self._batch
        if batch is None or getattr(batch, "token_ids_cpu", None) is not token_ids_cpu:
            batch = None
            try:
                runner = caller.f_locals.get("self") if caller is not None else None
                candidate = getattr(runner, "input_batch", None)
                if getattr(candidate, "token_ids_cpu", None) is token_ids_cpu:
                    batch = candidate
            except Exception:
                batch = None
            self._batch = batch
        ids = None
        if batch is not None:
            try:
                ids = list(batch.req_ids[:n_rows])
            except Exception:
                ids = None
            if ids is not None and (len(ids) != n_rows or not all(isinstance(i, str) for i in ids)
                                    or len(set(ids)) != n_rows):
                ids = None
        if ids is None and not self._warned:
            self._warned = True
            logger.warning("freespec: vLLM's request ids cannot be read here; requests are told apart by their "
                           "first tokens, length and last token (docs/reliability.md: request identity)")
        return ids
