"""The adapter's own keys of a ``{"plugin": ...}`` speculative config: one model, each default stated once.

``policy``: "goodput" (default) sets every step's bar for one more draft token from measured step times
(scorers/policy.py); "fixed" uses each plugin's own threshold, for experiments. In the load sweep of
docs/policy.md goodput was as fast or faster than "fixed" at every load.
``pad``: "auto" (default) gives a one-request step the size with the most expected output per measured
second (``GoodputPolicy.step_size``): the draft is padded, or its last tokens dropped where the plugin gives
their chances; "longer" only pads; "off" neither. It needs the goodput policy's step times: with "fixed"
there are none, and it is off.
``step_aside``: true (default) keeps a plugin out of the steps where drafting with it is slower than plain
decoding (``scorers.step_aside.StepAside``: a draft model that does not keep up with the target).
``scope``: "salt" (default) keeps what sources learn across requests per ``cache_salt`` (docs/security.md);
"global" shares it between all requests (no isolation); "none" learns nothing across requests.
``step_budget_ms``: a plugin step (everything the adapter calls on the plugin in one engine step) that takes
longer counts as a bad step for the circuit breaker (``breaker.CircuitBreaker``). Not given, it is
``DEFAULT_STEP_BUDGET_MS``, far above what the context sources take per step, raised to what a plugin's own
options need (``Proposer.step_time_needed``: pearl with a large ``sync_feed_tokens``).
"""
from __future__ import annotations

import os
from typing import Any, Literal, Optional, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from freespec.safe_files import short

DEFAULT_STEP_BUDGET_MS = 1000.0


class AdapterOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: Literal["goodput", "fixed"] = Field(
        "goodput",
        description='`"goodput"`: every step, draft only tokens whose expected gain pays for verifying them at the '
                    'measured load (docs/policy.md); `"fixed"`: each plugin\'s own fixed threshold, for experiments',
    )
    pad: Literal["auto", "longer", "off"] = Field(
        "auto",
        description='`"auto"`: with the goodput policy and one request decoding, score the step size with the '
                    'most expected output per measured second, 3% more than the draft\'s own: pad the draft, or '
                    'drop its last tokens where the plugin gives their chances (on some CPUs a step scoring 5 '
                    'tokens is faster than one scoring 1 or 9; docs/policy.md); `"longer"`: only pad; `"off"`: '
                    'neither',
    )
    step_aside: bool = Field(
        True, strict=True,
        description="a plugin whose own time is more than 5% of a step is measured against plain decoding at the "
                    "same number of requests, and drafts only where it is faster (scorers/step_aside.py; "
                    "docs/policy.md); false: it always drafts",
    )
    scope: Literal["salt", "global", "none"] = Field(
        "salt",
        description='what a source that learns across requests (suffix\'s recent outputs and responses file, '
                    'copy\'s recent outputs, recycle\'s matrix) may draft from: `"salt"`, only requests with the same '
                    '`cache_salt` (requests without one share a scope); `"global"`: every request; `"none"`: no '
                    'other request (docs/security.md)',
    )
    state_dir: Optional[str] = Field(
        None, strict=True,
        description="a folder (or a Redis URL redis://[user[:password]@]host:port/db, rediss:// with TLS: "
                    "suffix's responses shared through it, docs/deployment.md) where every source that learns across requests (suffix's responses, which also "
                    "fill hybrid's copy source, and recycle's matrix; not the copy plugin alone) of every replica "
                    "and rank keeps its state, each process its own files (mode 0600), "
                    "merging the others' (docs/security.md); made (mode 0700) if missing; replaces responses_path, "
                    "merge_from and matrix_path",
    )
    state_dir_trust_others: bool = Field(
        False, strict=True,
        description="merge files in state_dir that belong to another user or that others can write (replicas "
                    "running as different users); false: such files are refused with one warning",
    )
    state_max_age_days: float = Field(
        30.0, gt=0.0, le=3650.0, strict=True,
        description="files in state_dir older than this are neither merged nor kept (removed at start)",
    )
    state_max_mb: float = Field(
        256.0, gt=0.0, le=100_000.0, strict=True,
        description="the most bytes (MB of 10^6) one process keeps in state_dir for all cache_salt scopes "
                    "together; beyond, its least recently used scopes' files go (never another process's)",
    )
    state_dir_max_mb: float = Field(
        8_000.0, gt=0.0, le=10_000_000.0, strict=True,
        description="the most bytes (MB of 10^6) all processes' files in state_dir take together: at each start "
                    "the oldest go, whoever wrote them, but none written in the last hour (a live process's)",
    )
    step_budget_ms: Optional[float] = Field(
        None, ge=1.0, le=60_000.0, strict=True,
        description=f"the circuit breaker's budget for one plugin step: 3 steps over it in a row, or one over 10x, "
                    f"switch the plugin off for a back-off period (docs/reliability.md). Not set: "
                    f"{DEFAULT_STEP_BUDGET_MS:g}, raised to what the plugin's own options need (pearl with "
                    f"sync_feed_tokens above 16: its step_timeout_s)",
    )

    @field_validator("state_dir")
    @classmethod
    def _existing_folder(cls, value: Optional[str]) -> Optional[str]:
        if isinstance(value, str) and value.startswith(("redis://", "rediss://")):
            from freespec.proposers.learned.redis_stream import check_url

            return check_url(value)  # its ValueError names what is wrong, never the password
        if value is not None and (not value or "\0" in value or not os.path.isdir(value or ".")):
            parent = os.path.dirname(os.path.abspath(value)) if value and "\0" not in value else ""
            if not parent or not os.path.isdir(parent) or os.path.exists(value):
                raise ValueError("not a folder, nor one that can be made in an existing folder")
        return value

    @property
    def state_max_age_s(self) -> float:
        return self.state_max_age_days * 86_400.0

    @property
    def state_max_bytes(self) -> int:
        return int(self.state_max_mb * 1_000_000)

    @property
    def state_dir_max_bytes(self) -> int:
        return int(self.state_dir_max_mb * 1_000_000)

    @property
    def budget_s(self) -> float:
        return (self.step_budget_ms if self.step_budget_ms is not None else DEFAULT_STEP_BUDGET_MS) / 1000.0


ADAPTER_KEYS = tuple(AdapterOptions.model_fields)


def adapter_options(raw: dict[str, Any]) -> AdapterOptions:
    """The adapter's keys of ``raw`` (others ignored), checked; the error names the key and what it allows."""
    given = {key: raw[key] for key in ADAPTER_KEYS if key in raw and raw[key] is not None}
    try:
        return AdapterOptions.model_validate(given)
    except ValidationError as e:
        key = str(e.errors()[0]["loc"][0])
        got = given.get(key)
        if key == "state_dir" and isinstance(got, str):
            from freespec.proposers.learned.redis_stream import redacted

            got = redacted(got)  # a Redis URL's password never in a message
        raise ValueError(f"freespec: speculative_config {key!r} {_allowed(key)}, got {short(got)}") from None


def _allowed(key: str) -> str:
    field = AdapterOptions.model_fields[key]
    choices = get_args(field.annotation)
    if key in ("step_aside", "state_dir_trust_others"):
        return "must be true or false"
    if key == "state_dir":
        return ("must be a folder, or a new one's path in a folder that exists, or a URL "
                "redis://[user[:password]@]host:port/db (a string)")
    if key not in ("step_budget_ms", "state_max_age_days", "state_max_mb") and choices:
        return f"must be one of {list(choices)}"
    high = next(m.le for m in field.metadata if getattr(m, "le", None) is not None)
    low = next((m.ge for m in field.metadata if getattr(m, "ge", None) is not None), None)
    if low is not None:
        return f"must be a number in [{low:g}, {high:g}]"
    low = next(m.gt for m in field.metadata if getattr(m, "gt", None) is not None)
    return f"must be a number in ({low:g}, {high:g}]"  # the low end itself refused
