"""Each request slot's scope on Model Runner V2 (docs/security.md): what a V2 speculator reads to keep what it
learns across requests within one ``cache_salt`` tenant.

V2's worker keeps no sampling params per request, so the scope reaches a speculator through patch
``v2_salt_route`` (``patches/v2_salt_route.py``): the scheduler writes each request's scope (a one-way hash of
its salt, ``request_ids.scope_of``) into its sampling params, and after ``GPUModelRunner.add_requests`` the
route hands each new request's scope to the speculator's ``SlotScopes`` (its attribute ``scopes``), by slot.

The contract for a speculator (``FreespecSpeculator`` and any other, such as a GPU-resident one):

- hold ``self.scopes = SlotScopes(option, max_num_reqs)`` (``option``: the adapter's ``scope`` option);
- call ``self.scopes.reset(req_index)`` in ``add_request`` (a slot never keeps a finished request's scope);
- read ``self.scopes.of(slot)`` (a ``Row.scope``: a 32-hex-digit hash, ``SHARED_SCOPE`` for requests without
  a salt, or None: learns nothing across requests), or ``self.scopes.ids`` (one small int per slot: 0 none,
  1 shared, 2 and up one per tenant seen in this process; index it with ``InputBatch.idx_mapping_np``), for
  kernels that compare scopes without strings.

Without the route (disabled, or its seam moved), every slot of ``"scope": "salt"`` stays None: nothing is
learned across requests, never shared across tenants.
"""
from __future__ import annotations

import numpy as np

from freespec.proposers.api import SHARED_SCOPE
from freespec.vllm_plugins.request_ids import valid_scope

SCOPES_ATTRIBUTE = "scopes"  # where the route finds a speculator's SlotScopes
NO_SCOPE_ID, SHARED_SCOPE_ID = 0, 1


class SlotScopes:
    """Each request-state slot's scope, by the ``scope`` option: ``"salt"`` (the route's stamp), ``"global"``
    (every slot the shared scope) or ``"none"`` (no slot learns across requests)."""

    def __init__(self, option: str, max_reqs: int) -> None:
        self.option = option
        self.fixed = SHARED_SCOPE if option == "global" else None  # the scope of every slot, unless "salt"
        self._scopes: list[str | None] = [self.fixed] * max_reqs
        self.ids = np.full(max_reqs, self._id(self.fixed), dtype=np.int32)
        self._tenant_ids: dict[str, int] = {}

    def reset(self, slot: int) -> None:
        """A new request in ``slot``: no tenant's scope until the route assigns one."""
        self._set(slot, self.fixed)

    def assign(self, slot: int, stamped: object) -> None:
        """The route: the request in ``slot`` has scope ``stamped`` (as the scheduler wrote it). Only
        ``"salt"`` takes it, and only a value ``scope_of`` can give; anything else learns nothing across requests."""
        if self.option == "salt":
            self._set(slot, stamped if valid_scope(stamped) else None)  # type: ignore[arg-type]

    def of(self, slot: int) -> str | None:
        """The scope of the request in ``slot`` (``Row.scope``)."""
        return self._scopes[slot]

    def _set(self, slot: int, scope: str | None) -> None:
        self._scopes[slot] = scope
        self.ids[slot] = self._id(scope)

    def _id(self, scope: str | None) -> int:
        if scope is None:
            return NO_SCOPE_ID
        if scope == SHARED_SCOPE:
            return SHARED_SCOPE_ID
        return self._tenant_ids.setdefault(scope, len(self._tenant_ids) + 2)
