"""Model and tokenizer arguments: what vLLM accepts, resolved to a local directory.

A value is, in this order: a local checkpoint directory; the name of a test-fixture model
``freespec models`` prepares (freespec.model_store; for machines without a hub); or a
Hugging Face model id (``org/name``, optionally ``org/name@revision``), resolved with
``huggingface_hub.snapshot_download`` to its snapshot directory in the Hugging Face cache,
the cache vLLM itself uses (``$HF_HUB_CACHE``, ``$HF_HOME``). A missing snapshot is
downloaded only when the hub is reachable and offline mode (``HF_HUB_OFFLINE``) is off.
Freespec loads drafts and tokenizers from the returned directory, never from the hub itself.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from freespec import model_store

Kind = Literal["model", "tokenizer"]

# Files that show a directory holds a tokenizer (any one of them).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "config.json")
# Top-level files of a hub repo that a model or its tokenizer needs: config, tokenizer, chat template.
_CONFIG_PATTERNS = ["*.json", "*.model", "*.tiktoken", "*.txt", "*.jinja"]
_WEIGHT_PATTERNS = ["*.safetensors"]
_LEGACY_WEIGHT_PATTERNS = ["*.bin", "*.pt"]  # only for repos without safetensors, as vLLM falls back
_SUBFOLDERS = ["*/*"]  # vLLM loads a checkpoint from the repo's root; skip onnx/, gguf/, ...
_TRUE = {"1", "ON", "YES", "TRUE"}


class ModelRefError(ValueError):
    """A model argument names nothing usable; the message names the field and what was tried."""


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set: use the cache only."""
    return any(os.environ.get(var, "").strip().upper() in _TRUE
               for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_cache_dir() -> Path | None:
    """The Hugging Face hub cache named by the environment now, or None for huggingface_hub's default.

    Read at call time (huggingface_hub reads it once, at import), so a process that sets
    ``HF_HUB_CACHE`` or ``HF_HOME`` before resolving a model gets that cache.
    """
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.environ[var])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    return None


def _usable(path: Path, kind: Kind) -> bool:
    if kind == "model":
        return (path / "config.json").is_file()
    return any((path / name).is_file() for name in TOKENIZER_FILES)


def _lacks(what: str, kind: Kind) -> str:
    if kind == "model":
        return f"{what} is a directory without config.json, not a transformers checkpoint"
    return f"{what} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)})"


def split_model_id(value: str) -> tuple[str, str | None]:
    """``"org/name@rev"`` -> ``("org/name", "rev")``; no ``@``: revision None (the hub's main)."""
    repo_id, sep, revision = value.partition("@")
    return repo_id, (revision if sep else None)


def resolve_model(value: str, field: str, kind: Kind = "model") -> Path:
    """The local directory a model argument names: a path, a fixture name, or a Hugging Face id.

    ``field`` names the argument in errors (``draft_model``, ``--tokenizer``). ``kind``
    "model" needs ``config.json``; "tokenizer" needs any tokenizer file. Raises
    ModelRefError (a ValueError) saying what was tried.
    """
    value = str(value).strip()
    if not value:
        raise ModelRefError(f"{field}: empty; pass a Hugging Face model id (org/name) or a model directory")
    path = Path(value).expanduser()
    if path.is_dir():
        if not _usable(path, kind):
            raise ModelRefError(f"{field}: {_lacks(repr(value), kind)}")
        return path.resolve()
    if value in model_store.MODELS:
        prepared = model_store.model_dir(value)
        if not model_store.is_prepared(model_store.get_spec(value), prepared):
            raise ModelRefError(f"{field}: model {value!r} is not prepared at {prepared}; "
                                f"run `freespec models prepare {value}`")
        return prepared
    if path.is_absolute() or value.startswith((".", "~")) or path.exists():
        raise ModelRefError(f"{field}: {value!r} does not exist as a directory: neither a checkpoint "
                            "directory nor a Hugging Face model id (org/name)")
    return _resolve_hub_id(value, field, kind)


def _hub_error(field: str, value: str, reason: str) -> ModelRefError:
    tried = f"not a local directory, not a `freespec models` name ({', '.join(model_store.MODELS)})"
    return ModelRefError(f"{field}: {value!r}: {tried}, and as a Hugging Face model id: {reason}")


def _resolve_hub_id(value: str, field: str, kind: Kind) -> Path:
    try:
        import huggingface_hub
        from huggingface_hub import constants as hub_constants
        from huggingface_hub.errors import (
            GatedRepoError,
            HFValidationError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:
        raise ModelRefError(
            f"{field}: {value!r} is not a local directory; resolving it as a Hugging Face model id needs "
            "huggingface_hub, which comes with vLLM and transformers: install vllm-freespec[cpu] or [cuda]"
        ) from None

    repo_id, revision = split_model_id(value)
    cache = hub_cache_dir()
    where = str(cache or hub_constants.HF_HUB_CACHE)
    offline = hub_offline() or hub_constants.HF_HUB_OFFLINE
    patterns = _CONFIG_PATTERNS + (_WEIGHT_PATTERNS if kind == "model" else [])
    if offline:
        # Nothing is downloaded: ask only for the file whose absence makes the snapshot useless, so
        # that a snapshot vLLM downloaded with its own file patterns is accepted.
        patterns = ["config.json"]

    def snapshot(allow: list[str]) -> Path:
        return Path(huggingface_hub.snapshot_download(
            repo_id, revision=revision, cache_dir=cache, local_files_only=offline,
            allow_patterns=allow, ignore_patterns=_SUBFOLDERS,
        ))

    try:
        folder = snapshot(patterns)
        if kind == "model" and not offline and not any(folder.glob("*.safetensors")):
            folder = snapshot(_CONFIG_PATTERNS + _LEGACY_WEIGHT_PATTERNS)
    except HFValidationError as e:
        raise _hub_error(field, value, f"not a valid id ({e})") from None
    except GatedRepoError:
        raise _hub_error(field, value, "a gated repository; accept its terms on the hub and log in "
                         "(`hf auth login` or HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise _hub_error(field, value, f"the hub has no revision {revision!r}") from None
    except RepositoryNotFoundError:
        raise _hub_error(field, value, "no such repository on the hub (or it is private: log in)") from None
    except LocalEntryNotFoundError as e:
        if offline:
            reason = (f"not in the Hugging Face cache {where} for revision {revision or 'main'}, and "
                      "HF_HUB_OFFLINE is set (download it where the hub is reachable, or pass a directory)")
        else:
            reason = (f"not in the Hugging Face cache {where}, and the hub could not be reached "
                      f"({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__})")
        raise _hub_error(field, value, reason) from None
    except Exception as e:  # noqa: BLE001 - connection trouble (httpx's own errors), disk full, permissions
        raise _hub_error(field, value, f"{type(e).__name__}: {e}") from None
    if not _usable(folder, kind):
        raise ModelRefError(f"{field}: {_lacks(f'the snapshot of {value!r} at {folder}', kind)}")
    return folder
