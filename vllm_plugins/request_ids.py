"""Request identity: each batch row's vLLM request id, read from the model runner's input batch.

The ``custom_class`` seam passes no ids, but its caller is the model runner's ``propose_draft_token_ids``,
whose ``self.input_batch`` holds ``token_ids_cpu`` (the very array passed) and ``req_ids`` in the same row
order. The batch is found once through the caller's frame and then reused while it still holds that array;
anything unexpected (another vLLM, another caller, ids missing or repeated) gives None, and the adapter
tells requests apart by their tokens instead (``request_tracker.RequestTracker``), with one log line.
Named patch ``request_ids`` (``patches.PATCHES``, probe ``request_ids``): ``FREESPEC_DISABLE_PATCHES=request_ids``
leaves vLLM's frames alone, and requests are told apart by their tokens.

Each row's scope (docs/security.md) is read beside its id: the engine core's patch ``cache_salt_scope`` writes
``scope_of(cache_salt)`` into the request's ``sampling_params.extra_args[SCOPE_ARG]``, and the runner keeps those
params per request id (``runner.requests``). A row whose scope cannot be read (no ids, the patch disabled or its
seam moved) gets None: it learns nothing across requests.
"""
from __future__ import annotations

import hashlib
import logging
import re

from freespec import settings
from freespec.proposers.api import SHARED_SCOPE

logger = logging.getLogger("freespec")

SCOPE_ARG = "freespec_scope"  # the key of SamplingParams.extra_args the patch writes
_SCOPE_FORM = re.compile(r"[0-9a-f]{32}")


def scope_of(cache_salt: str | None) -> str:
    """A request's scope: a 128-bit BLAKE2b hash of its ``cache_salt`` (personalised for freespec, so it matches
    no other use of the salt), or ``SHARED_SCOPE`` without one. The salt itself never leaves the engine core."""
    if not cache_salt:
        return SHARED_SCOPE
    return hashlib.blake2b(cache_salt.encode("utf-8", "surrogatepass"), digest_size=16,
                           person=b"freespec-scope").hexdigest()


def valid_scope(value) -> bool:
    """Whether ``value`` is a scope ``scope_of`` can give."""
    return value == SHARED_SCOPE or (isinstance(value, str) and _SCOPE_FORM.fullmatch(value) is not None)


class BatchRequestIds:
    """Reads the engine's request id of each row; ``read`` gives None where they cannot be read."""

    def __init__(self) -> None:
        self._batch = None  # vLLM's input batch, once found
        self._runner = None  # the model runner that holds it (its ``requests``: each id's sampling params)
        self._warned = False
        self._scope_warned = False
        self.off = "request_ids" in settings.disabled_patches()
        self._scopes_off: bool | None = None  # decided at the first read (patch disabled or its seam moved)

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
            self._runner = runner if batch is not None else None
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

    def scopes(self, ids: list[str] | None, n_rows: int) -> list[str | None]:
        """Each row's scope as the patch ``cache_salt_scope`` wrote it; None where it cannot be read (the row
        then learns nothing across requests). Never raises."""
        if self._scopes_off is None:
            self._scopes_off = _scopes_unavailable()
        if ids is None or self._scopes_off:
            out = [None] * n_rows
        else:
            requests = getattr(self._runner, "requests", None) or {}
            out = [_scope(requests.get(i)) for i in ids]
        if None in out and not self._scope_warned:
            self._scope_warned = True
            logger.warning("freespec: a request's scope (its cache_salt) cannot be read here; such requests learn "
                           "nothing across requests (docs/security.md)")
        return out


def _scope(state) -> str | None:
    try:
        value = (state.sampling_params.extra_args or {}).get(SCOPE_ARG)
    except Exception:
        return None
    return value if valid_scope(value) else None


def _scopes_unavailable() -> bool:
    """Whether no request's scope can be trusted here: patch ``cache_salt_scope`` disabled, or its seam moved
    (then a value under ``SCOPE_ARG`` could only have come from a client)."""
    if "cache_salt_scope" in settings.disabled_patches():
        return True
    try:
        from freespec.vllm_plugins.probes import probe_cache_salt

        return not probe_cache_salt().ok
    except Exception:
        return True
