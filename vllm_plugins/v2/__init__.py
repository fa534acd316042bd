"""freespec on vLLM >= 0.34's Model Runner V2: every plugin a registered speculative method, ``freespec_<plugin>``.

- ``options``: a method's ``speculator_options`` checked with the checks of the ``{"plugin": ...}`` spelling (no vLLM).
- ``spelling``: ``{"plugin": NAME, ...}`` rewritten as ``{"method": "freespec_NAME", "speculator_options": ...}``.
- ``config``: one ``SpeculatorConfig`` per plugin (vLLM's registry seam; light, used in every process).
- ``speculator``: one ``BaseSpeculator`` per plugin, drafting with freespec's host-side proposers, the V1 adapter's
  goodput controller and circuit breaker around them.
- ``scopes``: each request slot's ``cache_salt`` scope (``SlotScopes``, filled by patch ``v2_salt_route``), the one
  place any V2 speculator reads it: ``speculator.scopes.of(slot)`` or ``speculator.scopes.ids``.
- ``registry``: registers them from freespec's general plugin.

Nothing here but ``scopes`` (plain Python, through ``patches``) is imported on vLLM < 0.34
(``version_gate.uses_v2_registry``); the V1 ``custom_class`` path stays.
"""
