"""A config with a ``state_dir`` is measured from an empty one: each of its server groups (a round, a
concurrency level, or all levels with ``--reuse-server``) gets a new folder inside the given one.

Why: a plugin merges every file it finds in its state directory at start, so a second round's (or level's)
server would begin with what the first learned from the same prompts, and its "first pass" would be a repeat.
The folder's name says the run, the config and the group; the user's own files beside it are left alone. A
group's restart and replica share its folder: that is what ``--repeat-traffic restart replica`` measure.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any, Sequence


def fresh_state(target: Any, levels: Sequence[int], round_index: int, started_at: str) -> Any:
    """``target`` (a ``run.Target``) with its config's ``state_dir`` replaced by a new folder inside it for this
    group, made mode 0700; the target itself when its config has no ``state_dir`` or the server is not ours
    (``--base-url``), or when the folder does not exist (the server's own check then names it); a folder that
    cannot be made is said in a note, and the given one used."""
    config = target.config
    base = config.path_option("state_dir")
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
