"""Multi-turn chat from ShareGPT-style conversations, only where the machine has them: ``--chat-data FILE``
(a ShareGPT ``.json`` list or ``.jsonl``: ``{"conversations": [{"from": "human", "value": ...}, ...]}``), else
an installed Python distribution whose name contains ``sharegpt`` that carries such a file. freespec ships
none. The human turns are replayed in order; the model's own answers replace the recorded ones."""
from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from freespec.bench.workloads.session import Session, Workload

NAME = "chat"
HUMAN_ROLES = ("human", "user")
DATA_SUFFIXES = (".json", ".jsonl")
JSON_LOAD_LIMIT = 64 << 20  # a .json list larger than this is streamed with ijson, or skipped without it


def installed_data_files() -> list[Path]:
    """ShareGPT-style data files of installed distributions named like ``*sharegpt*``, in a fixed order."""
    found = []
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if "sharegpt" not in name:
            continue
        for file in dist.files or ():
            if str(file).endswith(DATA_SUFFIXES) and "dist-info" not in str(file):
                path = Path(str(dist.locate_file(file)))
                if path.is_file():
                    found.append(path)
    return sorted(set(found))


def _records(path: Path) -> Iterator[Any]:
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    try:
                        yield json.loads(line)
                    except ValueError:
                        continue
        return
    if path.stat().st_size <= JSON_LOAD_LIMIT:
        data = json.loads(path.read_text(encoding="utf-8"))
        yield from data if isinstance(data, list) else ()
        return
    try:
        import ijson
    except ImportError:
        return
    with path.open("rb") as fh:
        yield from ijson.items(fh, "item")


def human_turns(record: Any) -> list[str]:
    """The human messages of one ShareGPT conversation, in order."""
    if not isinstance(record, dict):
        return []
    turns = record.get("conversations") or record.get("conversation") or []
    return [t.get("value") for t in turns if isinstance(t, dict) and t.get("from") in HUMAN_ROLES
            and isinstance(t.get("value"), str) and t.get("value").strip()]


def conversations(path: Path, count: int, turns: int, max_chars: int) -> list[list[str]]:
    """The first ``count`` conversations of ``path`` with two or more human turns whose first ``turns`` of
    them take at most ``max_chars`` characters, cut to ``turns`` turns."""
    found = []
    for record in _records(path):
        human = human_turns(record)[:turns]
        if len(human) >= 2 and sum(len(t) for t in human) <= max_chars:
            found.append(human)
            if len(found) >= count:
                break
    return found


def build(sessions: int, turns: int, max_chars: int, data: str | None = None) -> Workload:
    """Sessions of ShareGPT conversations, or a workload marked skipped (with why) where there are none."""
    description = f"multi-turn chat: ShareGPT conversations, up to {turns} human turns each"
    paths = [Path(data)] if data else installed_data_files()
    if data and not Path(data).is_file():
        return Workload(NAME, description, skipped=f"--chat-data {data}: no such file")
    if not paths:
        return Workload(NAME, description, skipped="no ShareGPT conversations on this machine: no installed "
                                                   "distribution named *sharegpt* carries a .json/.jsonl file, "
                                                   "and no --chat-data FILE was given")
    for path in paths:
        found = conversations(path, sessions, turns, max_chars)
        if found:
            return Workload(f"{NAME}", f"{description}, from {path}",
                            [Session(f"{NAME}-{i}", c) for i, c in enumerate(found)])
    return Workload(NAME, description, skipped=f"no conversation of two or more human turns within {max_chars} "
                                               f"characters in {', '.join(map(str, paths))}")
