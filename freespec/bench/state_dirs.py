"""A config with a ``state_dir`` is measured from an empty one: each of its server groups (a round, a
concurrency level, or all levels with ``--reuse-server``) gets a new folder inside the given one.

Why: a plugin merges every file it finds in its state directory at start, so a second round's (or level's)
server would begin with what the first learned from the same prompts, and its "first pass" would be a repeat.
The folder's name says the run, the config and the group; the user's own files beside it are left alone. A
group's restart and replica share its folder: that is what ``--repeat-traffic restart replica`` measure.

A ``state_dir`` that is a Redis URL (``redis://host:port/db``, a server the operator runs; the bench starts none)
cannot be made anew: before each group the bench purges, in whole, what freespec learned there (every source,
scope and tokenizer: ``freespec state purge URL``), so give it a Redis (or a database number) of its own, and
each config its own database (``/0``, ``/1``): one database is one fleet, whose servers learn from each other
(with ``--interleave`` too). A group's restart and replica share it. The report names each config's backend.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from typing import Any, Sequence

from freespec.proposers.learned import is_url


def fresh_state(target: Any, levels: Sequence[int], round_index: int, started_at: str) -> Any:
    """``target`` (a ``run.Target``) with its config's ``state_dir`` replaced by a new folder inside it for this
    group, made mode 0700; the target itself when its config has no ``state_dir`` or the server is not ours
    (``--base-url``), or when the folder does not exist (the server's own check then names it); a folder that
    cannot be made is said in a note, and the given one used."""
    config = target.config
    base = config.path_option("state_dir")
    if base is not None and is_url(base) and not getattr(target, "base_url", None):
        _purge_redis(config.label, base)
        return target
    if base is None or getattr(target, "base_url", None) or not os.path.isdir(base):
        return target
    stamp = "".join(ch for ch in started_at if ch.isdigit())
    tag = hashlib.sha256(config.label.encode()).hexdigest()[:8]
    path = os.path.join(base, f"bench-{stamp}-{tag}-round{round_index + 1}-c{'-'.join(map(str, levels))}")
    try:
        os.mkdir(path, 0o700)
    except OSError as e:  # the server then uses the folder given, and says what it finds there
        print(f"[{config.label}] note: no new state_dir folder could be made ({e}); this group's server uses "
              f"{base} as given, and its first pass is cold only if that is empty", flush=True)
        return target
    print(f"[{config.label}] state_dir for this group: {path} (empty: earlier rounds and levels do not warm it)",
          flush=True)
    new_config = dataclasses.replace(config, speculative_config={**config.speculative_config, "state_dir": path})
    return dataclasses.replace(target, config=new_config)


def _purge_redis(label: str, url: str) -> None:
    """Empty what freespec learned in the Redis at ``url`` for this group's servers; said in a note either way
    (the URL without its password)."""
    from freespec.proposers.learned.redis_stream import purge, redacted

    where = redacted(url)
    try:
        gone = purge(url)
    except Exception as e:  # noqa: BLE001 - the server then says what it finds (or that Redis is down)
        print(f"[{label}] note: state_dir {where} could not be emptied ({type(e).__name__}: {e}); this group's "
              "first pass is cold only if it holds nothing", flush=True)
        return
    print(f"[{label}] state_dir for this group: Redis {where}, {gone} learned record(s) purged first (earlier "
          "rounds and levels do not warm it)", flush=True)


def backend(config: Any) -> str | None:
    """Where a config's servers keep learned state: ``redis`` (a URL), ``folder``, or None (no ``state_dir``)."""
    base = config.path_option("state_dir")
    return None if base is None else "redis" if is_url(base) else "folder"


def shown(config: Any) -> dict | None:
    """The config's ``speculative_config`` as results record it: a Redis URL's password replaced by ``***``."""
    sc = config.speculative_config
    base = config.path_option("state_dir")
    if base is None or not is_url(base):
        return sc
    from freespec.proposers.learned.redis_stream import redacted

    return {**sc, "state_dir": redacted(base)}


_PASSWORD = re.compile(r"(rediss?://[^:/@\s\"]*:)[^\s\"/]*@")  # to the last @ before the host, as URLs read


def redacted_command(cmd: list[str]) -> list[str]:
    """A server's command as results record it: a Redis URL's password (in ``--speculative-config``) as ``***``."""
    return [_PASSWORD.sub(r"\1***@", arg) for arg in cmd]
