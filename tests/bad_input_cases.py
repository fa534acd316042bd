"""Bad configs and bad files an operator can hand freespec, each run the way vLLM would run it.

Every case is a ``--speculative-config`` (and the files it points to, written into a scratch directory).
``attempt`` runs it through what vLLM runs: the front-end's ``translate`` (called while vLLM parses its
arguments, before any engine starts), then, for a config that passes, the plugin's constructor and
``bind`` (what the adapter calls in the worker at engine start), and for the cases that need it one
serving action (a save). A case's outcome is:

- ``refused``: a ``ValueError`` (freespec's config, datastore and matrix errors all are one) whose message
  is what the user sees;
- ``logged``: accepted, and a warning logged (the server goes on);
- ``accepted``: nothing said (a bad input got through);
- ``crash``: any other exception (a traceback instead of a named error).

``tests/test_bad_inputs.py`` runs them all; ``scripts/bad_inputs.py --markdown`` prints the table in
docs/reliability.md.
"""
from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from freespec.proposers.base import EngineInfo
from freespec.proposers.registry import load_proposer_class
from freespec.vllm_plugins.frontend import check_additional_config, translate

from integration_tests.faulty import read_only_dir

K = 4
VOCAB = 1000  # the stand-in target's vocabulary (the datastore's "tokenizer" maps characters into it)
FINGERPRINT = "sha256:bad-inputs-tokenizer"
CANDIDATES = 8  # recycle's default


@dataclass(frozen=True)
class Case:
    what: str  # the bad input, as a user would describe it
    names: str  # the field or file the message must name
    make: Callable[[Path], dict]  # writes the case's files under a scratch directory; returns the config
    expect: str = "refused"  # or "logged"
    serve: Callable[[object, Path], None] | None = None  # an action after a successful start (a save)
    # The plain-vLLM spelling: ``make`` returns ``additional_config["freespec"]`` (with ``"k"``, K), which no
    # front-end sees; the adapter checks it at engine start, with the front-end's messages.
    plain: bool = False


@dataclass
class Outcome:
    kind: str  # "refused", "logged", "accepted", "crash"
    stage: str  # "config" (before vLLM starts), "engine start" (the plugin's loader), "serving"
    message: str


# ---------------------------------------------------------------- files the cases start from
def corpus_datastore(d: Path, name: str = "ds", fingerprint: str = FINGERPRINT) -> str:
    """A small valid datastore built by freespec's own builder (one character per token)."""
    from freespec.proposers.retrieval.build import build_datastore

    corpus = d / f"{name}.jsonl"
    texts = ["def load(path):\n    return open(path).read()\n", "the quick brown fox jumps over the lazy dog"]
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = d / name
    build_datastore(
        [corpus], out, lambda batch: [[ord(c) % VOCAB for c in t] for t in batch],
        tokenizer_name="bad-inputs-chars", fingerprint=fingerprint, vocab_size=VOCAB, progress=False,
    )
    return str(out)


def edit_manifest(store: str, change: Callable[[dict], None]) -> str:
    path = Path(store) / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))
    return store


def shard_file(store: str, suffix: str) -> Path:
    name = json.loads((Path(store) / "manifest.json").read_text())["shards"][0]["name"]
    return Path(store) / f"{name}.{suffix}"


def matrix_file(d: Path, name: str = "matrix.npz", vocab: int = VOCAB, tokenizer: str = FINGERPRINT) -> Path:
    """A valid recycle matrix file, written by freespec's own writer."""
    from freespec.proposers.recycle.matrix import save_matrix

    path = d / name
    ids = np.full((vocab, CANDIDATES), -1, dtype=np.int32)
    ids[:10, 0] = np.arange(1, 11)
    save_matrix(str(path), ids, np.zeros_like(ids, dtype=np.float16), tokenizer=tokenizer)
    return path


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def crafted_header_matrix(d: Path) -> Path:
    """A matrix archive whose ``ids.npy`` header declares 2**40 x 8 int32 (about 32 TiB)."""
    good = matrix_file(d, "good.npz")
    path = d / "matrix.npz"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "ids.npy":
                header = {"descr": "<i4", "fortran_order": False, "shape": (1 << 40, CANDIDATES)}
                buf = io.BytesIO()
                np.lib.format.write_array_header_1_0(buf, header)
                data = buf.getvalue() + data[len(data) - 64:]
            dst.writestr(info.filename, data)
    return path


def deflated_matrix(d: Path, ids: Callable[[bytes], bytes]) -> Path:
    """A good matrix archive rewritten deflated, its ``ids.npy`` member's bytes replaced by ``ids(bytes)``."""
    good = matrix_file(d, "good.npz")
    path = d / "matrix.npz"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info.filename, ids(data) if info.filename == "ids.npy" else data)
    return path


def inflating_matrix(d: Path) -> Path:
    """A compressed matrix archive whose ``ids.npy`` member inflates to 256 MiB (the header is right)."""
    return deflated_matrix(d, lambda data: data + bytes(256 << 20))


def truncated(path: Path) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def draft_without_weights(d: Path) -> str:
    """A checkpoint directory with a ``config.json`` and no weights."""
    out = d / "draft"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    }))
    return str(out)


def save_into_read_only_dir(proposer, d: Path) -> None:
    """What the recycle file thread does every ``save_every_s``, with the matrix's directory read-only."""
    with read_only_dir(d / "matrices"):
        proposer.save()


def spec(plugin, **options) -> dict:
    return {"plugin": plugin, "num_speculative_tokens": K, **options}


def store_dir(d: Path) -> Path:
    (d / "stores").mkdir(exist_ok=True)
    return d / "stores"


def matrices(d: Path) -> Path:
    (d / "matrices").mkdir(exist_ok=True)
    return d / "matrices"


# ---------------------------------------------------------------- the cases
CASES: list[Case] = [
    # The front-end, for every plugin.
    Case("unknown plugin name `\"plugin\": \"fastest\"`", "'fastest'", lambda d: spec("fastest")),
    Case("`\"plugin\"` not a string (`7`)", "'plugin'", lambda d: spec(7)),
    Case("`\"plugin\"` together with vLLM's `\"method\": \"ngram\"`", "'method'",
         lambda d: spec("copy", method="ngram")),
    Case("`num_speculative_tokens` missing", "'num_speculative_tokens'",
         lambda d: {"plugin": "copy"}),
    Case("`num_speculative_tokens: 0`", "'num_speculative_tokens'",
         lambda d: {"plugin": "copy", "num_speculative_tokens": 0}),
    Case("`num_speculative_tokens: \"4\"` (a string)", "'num_speculative_tokens'",
         lambda d: {"plugin": "copy", "num_speculative_tokens": "4"}),
    Case("`num_speculative_tokens: 8000` (above its bound)", "'num_speculative_tokens'",
         lambda d: {"plugin": "copy", "num_speculative_tokens": 8000}),
    Case("`disable_by_batch_size: 8` (a key of other vLLM releases)", "'disable_by_batch_size'",
         lambda d: spec("copy", disable_by_batch_size=8)),
    Case("`policy: \"fast\"`", "'policy'", lambda d: spec("copy", policy="fast")),
    Case("`step_budget_ms: 0`", "'step_budget_ms'", lambda d: spec("copy", step_budget_ms=0)),
    Case("`step_budget_ms: \"100\"` (a string)", "'step_budget_ms'", lambda d: spec("copy", step_budget_ms="100")),
    Case("`plugin: \"freespec.nowhere:Drafter\"` (a module that does not exist)", "freespec.nowhere:Drafter",
         lambda d: spec("freespec.nowhere:Drafter")),
    Case("`plugin: \"json:JSONDecoder\"` (a class that is not a proposer)", "json:JSONDecoder",
         lambda d: spec("json:JSONDecoder")),
    # copy
    Case("copy: unknown option `min_matches`", "'min_matches'", lambda d: spec("copy", min_matches=2)),
    Case("copy: `min_match: 0`", "'min_match'", lambda d: spec("copy", min_match=0)),
    Case("copy: `max_match: 4, min_match: 8`", "max_match", lambda d: spec("copy", max_match=4, min_match=8)),
    Case("copy: `pool_tokens: -5`", "'pool_tokens'", lambda d: spec("copy", pool_tokens=-5)),
    Case("copy: `pool_tokens: 1e12` (above its bound)", "'pool_tokens'", lambda d: spec("copy", pool_tokens=10**12)),
    Case("copy: `adaptive: \"sometimes\"`", "'adaptive'", lambda d: spec("copy", adaptive="sometimes")),
    # recycle: options
    Case("recycle: `candidates: 64`", "'candidates'", lambda d: spec("recycle", candidates=64)),
    Case("recycle: `candidates: 32, tree_widths: [32]*8` (1.1e12 tree nodes)", "tree_widths",
         lambda d: spec("recycle", candidates=32, tree_widths=[32] * 8)),
    Case("recycle: `tree_widths: [4, 0]`", "tree_widths", lambda d: spec("recycle", tree_widths=[4, 0])),
    Case("recycle: `tree_widths: [16]` with `candidates: 8`", "tree_widths",
         lambda d: spec("recycle", tree_widths=[16])),
    Case("recycle: `matrix_path` in a directory that does not exist", "matrix_path",
         lambda d: spec("recycle", matrix_path=str(d / "missing" / "m.npz"))),
    Case("recycle: `save_every_s: -1`", "'save_every_s'", lambda d: spec("recycle", save_every_s=-1)),
    Case("recycle: `merge_from` a string, not a list", "merge_from",
         lambda d: spec("recycle", merge_from=str(d / "peer.npz"))),
    # recycle: matrix files (read at engine start)
    Case("recycle: `matrix_path` a `.npy` array renamed `.npz`", "matrix.npz",
         lambda d: spec("recycle", matrix_path=str(_write(matrices(d) / "matrix.npz", npy_bytes(np.zeros((4, 4))))))),
    Case("recycle: `matrix_path` with a crafted `.npy` header (2**40 rows)", "'ids'",
         lambda d: spec("recycle", matrix_path=str(crafted_header_matrix(matrices(d))))),
    Case("recycle: `matrix_path` a compressed archive inflating to 256 MiB", "'ids'",
         lambda d: spec("recycle", matrix_path=str(inflating_matrix(matrices(d))))),
    Case("recycle: `matrix_path` learned with another tokenizer", "'tokenizer'",
         lambda d: spec("recycle", matrix_path=str(matrix_file(matrices(d), tokenizer="sha256:another")))),
    Case("recycle: `matrix_path` of another vocabulary size", "'vocab_size'",
         lambda d: spec("recycle", matrix_path=str(matrix_file(matrices(d), vocab=VOCAB // 2)))),
    Case("recycle: `matrix_path` a text file", "matrix.npz",
         lambda d: spec("recycle", matrix_path=str(_write(matrices(d) / "matrix.npz", b"not a matrix\n")))),
    Case("recycle: `matrix_path` truncated (half a file)", "matrix.npz",
         lambda d: spec("recycle", matrix_path=str(truncated(matrix_file(matrices(d)))))),
    Case("recycle: `matrix_path` a directory", "matrix.npz",
         lambda d: spec("recycle", matrix_path=str(_mkdir(matrices(d) / "matrix.npz")))),
    Case("recycle: `merge_from` a corrupt file at start", "peer.npz",
         lambda d: spec("recycle", merge_from=[str(truncated(matrix_file(matrices(d), "peer.npz")))])),
    Case("recycle: the matrix directory read-only (when it saves)", "matrix.npz",
         lambda d: spec("recycle", matrix_path=str(matrices(d) / "matrix.npz")),
         expect="logged", serve=save_into_read_only_dir),
    # retrieval: options and the manifest (read when the config is parsed)
    Case("retrieval: `datastore` missing", "'datastore'", lambda d: spec("retrieval")),
    Case("retrieval: `datastore` a directory that does not exist", "datastore",
         lambda d: spec("retrieval", datastore=str(d / "no-such-store"))),
    Case("retrieval: `datastore` a file, not a directory", "datastore",
         lambda d: spec("retrieval", datastore=str(_write(d / "store.jsonl", b"{}\n")))),
    Case("retrieval: `datastore` a list", "'datastore'", lambda d: spec("retrieval", datastore=[str(d)])),
    Case("retrieval: `datastore` a directory without `manifest.json`", "manifest.json",
         lambda d: spec("retrieval", datastore=str(_mkdir(d / "empty-store")))),
    Case("retrieval: `manifest.json` not JSON", "manifest.json",
         lambda d: spec("retrieval", datastore=_broken_manifest(d))),
    Case("retrieval: `manifest.json` of format version 2", "version",
         lambda d: spec("retrieval", datastore=edit_manifest(corpus_datastore(store_dir(d)),
                                                             lambda m: m.update(version=2)))),
    Case("retrieval: a shard name that is absolute (`/etc/passwd`)", "shards[0].name",
         lambda d: spec("retrieval", datastore=edit_manifest(corpus_datastore(store_dir(d)),
                                                             lambda m: m["shards"][0].update(name="/etc/passwd")))),
    Case("retrieval: a shard name with `../`", "shards[0].name",
         lambda d: spec("retrieval", datastore=edit_manifest(corpus_datastore(store_dir(d)),
                                                             lambda m: m["shards"][0].update(name="../ds2/00000")))),
    Case("retrieval: `manifest.json` `tokenizer` a string", "'tokenizer'",
         lambda d: spec("retrieval", datastore=edit_manifest(corpus_datastore(store_dir(d)),
                                                             lambda m: m.update(tokenizer="fake-chars")))),
    Case("retrieval: a shard's `tokens` a string", "shards[0].tokens",
         lambda d: spec("retrieval", datastore=edit_manifest(corpus_datastore(store_dir(d)),
                                                             lambda m: m["shards"][0].update(tokens="many")))),
    Case("retrieval: a shard's `.tokens` file truncated", ".tokens",
         lambda d: spec("retrieval", datastore=_truncate_shard(corpus_datastore(store_dir(d)), "tokens"))),
    Case("retrieval: a shard's `.sa` file missing", ".sa",
         lambda d: spec("retrieval", datastore=_remove_shard(corpus_datastore(store_dir(d)), "sa"))),
    Case("retrieval: a datastore built with another tokenizer", "another tokenizer",
         lambda d: spec("retrieval", datastore=corpus_datastore(store_dir(d), fingerprint="sha256:another"))),
    Case("retrieval: `in_memory_mb: -1`", "'in_memory_mb'",
         lambda d: spec("retrieval", datastore=corpus_datastore(store_dir(d)), in_memory_mb=-1)),
    Case("retrieval: `max_continuations: 0`", "'max_continuations'",
         lambda d: spec("retrieval", datastore=corpus_datastore(store_dir(d)), max_continuations=0)),
    # hybrid
    Case("hybrid: `sources: [\"copy\", \"oracle\"]`", "sources", lambda d: spec("hybrid", sources=["copy", "oracle"])),
    Case("hybrid: `sources: [\"retrieval\"]` without `datastore`", "datastore",
         lambda d: spec("hybrid", sources=["retrieval"])),
    Case("hybrid: `datastore` with `sources` that leave out `retrieval`", "datastore",
         lambda d: spec("hybrid", sources=["copy"], datastore=corpus_datastore(store_dir(d)))),
    Case("hybrid: unknown option `candidates` (a recycle option)", "'candidates'",
         lambda d: spec("hybrid", candidates=8)),
    Case("hybrid: `datastore` a directory that does not exist", "datastore",
         lambda d: spec("hybrid", sources=["copy", "retrieval"], datastore=str(d / "no-such-store"))),
    Case("hybrid: `datastore` with a `../` shard name", "shards[0].name",
         lambda d: spec("hybrid", sources=["copy", "retrieval"], datastore=edit_manifest(
             corpus_datastore(store_dir(d)), lambda m: m["shards"][0].update(name="../ds2/00000")))),
    # pearl
    Case("pearl: `draft_model` missing", "'draft_model'", lambda d: spec("pearl")),
    Case("pearl: `draft_model` a path that does not exist", "draft_model",
         lambda d: spec("pearl", draft_model=str(d / "no-such-model"))),
    Case("pearl: `draft_model` a directory without `config.json`", "draft_model",
         lambda d: spec("pearl", draft_model=str(_mkdir(d / "not-a-model")))),
    Case("pearl: `draft_model` a `config.json` without weights", "draft_model",
         lambda d: spec("pearl", draft_model=draft_without_weights(d))),
    Case("pearl: `device: \"gpu\"`", "'device'", lambda d: spec("pearl", draft_model=draft_without_weights(d),
                                                               device="gpu")),
    Case("pearl: `step_timeout_s: 600`", "'step_timeout_s'",
         lambda d: spec("pearl", draft_model=draft_without_weights(d), step_timeout_s=600)),
    Case("pearl: `placement: \"mpi\"`", "'placement'",
         lambda d: spec("pearl", draft_model=draft_without_weights(d), placement="mpi")),
    Case("pearl: `draft_cores: \"0-63\"`", "draft_cores",
         lambda d: spec("pearl", draft_model=draft_without_weights(d), draft_cores="0-63")),
    # issue 52: files that are not regular files, deep JSON, absurd numbers, header bombs, path options
    Case("recycle: `matrix_path` a FIFO (would block `open()` for good)", "FIFO",
         lambda d: spec("recycle", matrix_path=str(_fifo(matrices(d) / "matrix.npz")))),
    Case("recycle: `merge_from` a FIFO at start", "peer.npz",
         lambda d: spec("recycle", merge_from=[str(_fifo(matrices(d) / "peer.npz"))])),
    Case("recycle: `matrix_path` whose metadata JSON is nested 100,000 deep", "nested",
         lambda d: spec("recycle", matrix_path=_matrix_with(matrices(d), meta=b"[" * 100_000 + b"]" * 100_000))),
    Case("recycle: `matrix_path` with a NaN probability", "'probs'",
         lambda d: spec("recycle", matrix_path=_matrix_with(matrices(d), nan=True))),
    Case("recycle: `matrix_path` with a row stamped 2**32 - 1 (wins every merge)", "'stamps'",
         lambda d: spec("recycle", matrix_path=_matrix_with(matrices(d), stamp=2**32 - 1))),
    Case("recycle: `matrix_path` a deflated archive with a 256 MiB `.npy` header", "'ids'",
         lambda d: spec("recycle", matrix_path=_header_bomb(matrices(d)))),
    Case("recycle: `matrix_path: \"\"`", "matrix_path", lambda d: spec("recycle", matrix_path="")),
    Case("recycle: `matrix_path` with a NUL byte", "matrix_path",
         lambda d: spec("recycle", matrix_path=str(d / "m\0.npz"))),
    Case("copy: `min_match: \"2\"` (a string: never converted)", "'min_match'", lambda d: spec("copy", min_match="2")),
    Case("retrieval: `manifest.json` nested 100,000 deep", "manifest.json",
         lambda d: spec("retrieval", datastore=_deep_manifest(d))),
    Case("retrieval: a shard's `.tokens` file a FIFO", ".tokens",
         lambda d: spec("retrieval", datastore=_fifo_shard(corpus_datastore(store_dir(d)), "tokens"))),
    Case("retrieval: `manifest.json` `total_tokens` a string", "total_tokens",
         lambda d: spec("retrieval", datastore=edit_manifest(corpus_datastore(store_dir(d)),
                                                             lambda m: m.update(total_tokens="many")))),
    # plugin names (issue 52, class 6): the form checked before any import; only a concrete Proposer
    Case("`\"plugin\": \"..x:y\"` (not a class path)", "class path", lambda d: spec("..x:y")),
    Case("`\"plugin\": \":\"`", "class path", lambda d: spec(":")),
    Case("`\"plugin\"` the abstract `freespec.proposers.base:Proposer`", "abstract",
         lambda d: spec("freespec.proposers.base:Proposer")),
    # the plain-vLLM spelling, --additional-config '{"freespec": {...}}' (class 7): the same checks
    Case("plain spelling: `\"policy\": \"fast\"`", "'policy'",
         lambda d: {"plugin": "copy", "options": {}, "policy": "fast"}, plain=True),
    Case("plain spelling: `\"pad\": \"bogus\"`", "'pad'",
         lambda d: {"plugin": "copy", "options": {}, "pad": "bogus"}, plain=True),
    Case("plain spelling: K = 8000", "num_speculative_tokens",
         lambda d: {"plugin": "copy", "options": {}, "k": 8000}, plain=True),
    Case("plain spelling: an unknown key `\"polcy\"`", "polcy",
         lambda d: {"plugin": "copy", "options": {}, "polcy": "fixed"}, plain=True),
    Case("`step_aside: \"yes\"` (a string)", "'step_aside'", lambda d: spec("copy", step_aside="yes")),
    # issue 67: a boolean is not a number, for every plugin's options
    Case("copy: `min_match: true` (a boolean)", "'min_match'", lambda d: spec("copy", min_match=True)),
    Case("recycle: `tree_widths: [4, true]`", "'tree_widths'", lambda d: spec("recycle", tree_widths=[4, True])),
]


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def _fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def _fifo_shard(store: str, suffix: str) -> str:
    path = shard_file(store, suffix)
    path.unlink()
    os.mkfifo(path)
    return store


def _matrix_with(d: Path, meta: bytes | None = None, nan: bool = False, stamp: int | None = None) -> str:
    """A matrix file written as freespec's writer does, with one field made absurd."""
    from freespec.proposers.recycle.matrix import save_matrix

    path = d / "matrix.npz"
    ids = np.full((VOCAB, CANDIDATES), -1, dtype=np.int32)
    ids[:10, 0] = np.arange(1, 11)
    probs = np.zeros_like(ids, dtype=np.float16)
    probs[1, 0] = np.nan if nan else 0.5
    stamps = (ids[:, 0] >= 0).astype(np.uint32)
    if stamp is not None:
        stamps[1] = stamp
    save_matrix(str(path), ids, probs, stamps, tokenizer=FINGERPRINT)
    if meta is not None:
        with zipfile.ZipFile(d / "matrix.npz") as src:
            members = {i.filename: src.read(i) for i in src.infolist()}
        members["meta.npy"] = npy_bytes(np.frombuffer(meta, dtype=np.uint8))
        with zipfile.ZipFile(path, "w") as dst:
            for name, data in members.items():
                dst.writestr(name, data)
    return str(path)


def _header_bomb(d: Path) -> str:
    """A deflated matrix archive (262 KB) whose ``ids.npy`` has a version-2 header of 256 MiB."""
    bomb = b"\x93NUMPY\x02\x00" + (256 << 20).to_bytes(4, "little") + b" " * (256 << 20)
    return str(deflated_matrix(d, lambda data: bomb))


def _deep_manifest(d: Path) -> str:
    store = corpus_datastore(store_dir(d))
    (Path(store) / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    return store


def _broken_manifest(d: Path) -> str:
    store = corpus_datastore(store_dir(d))
    (Path(store) / "manifest.json").write_text('{"format": "freespec-datastore", "version": 1, ')
    return store


def _truncate_shard(store: str, suffix: str) -> str:
    truncated(shard_file(store, suffix))
    return store


def _remove_shard(store: str, suffix: str) -> str:
    shard_file(store, suffix).unlink()
    return store


# ---------------------------------------------------------------- running a case
class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def start_plugin(extra: dict):
    """The plugin as the adapter builds it at engine start: options, constructor, ``bind``."""
    cfg = extra["freespec"]
    cls = load_proposer_class(cfg["plugin"])
    proposer = cls(cls.Options.model_validate(cfg["options"]), K)
    try:
        proposer.bind(EngineInfo(vocab_size=VOCAB, model="bad-inputs", tokenizer_fingerprint=lambda: FINGERPRINT))
    except BaseException:
        stop_plugin(proposer)
        raise
    return proposer


def stop_plugin(proposer) -> None:
    close = getattr(proposer, "close", None)
    if callable(close):
        close()
    store = getattr(proposer, "store", None)
    if store is not None and callable(getattr(store, "close", None)):
        store.close()


def attempt(case: Case, scratch: Path) -> Outcome:
    """Run ``case`` with its files under ``scratch`` (an empty directory)."""
    handler = _Warnings()
    logger = logging.getLogger("freespec")
    logger.addHandler(handler)
    stage = "config"
    try:
        config = case.make(scratch)
        if case.plain:
            stage = "engine start"
            k = config.pop("k", K)
            plugin, options, _ = check_additional_config(config, k)
            extra = {"freespec": {"plugin": plugin, "options": options.model_dump(mode="json")}}
        else:
            _, extra = translate(config, None)
            stage = "engine start"
        proposer = start_plugin(extra)
        stage = "serving"
        try:
            if case.serve is not None:
                case.serve(proposer, scratch)
        finally:
            stop_plugin(proposer)
    except ValueError as e:
        return Outcome("refused", stage, str(e))
    except Exception as e:  # noqa: BLE001 - a crash is what this looks for
        return Outcome("crash", stage, f"{type(e).__name__}: {e}")
    finally:
        logger.removeHandler(handler)
    if handler.messages:
        return Outcome("logged", stage, handler.messages[0])
    return Outcome("accepted", stage, "")


TEMP_NAME = re.compile(r"(/\.[a-z]+-)(?:[0-9]+-)?(?:[A-Za-z0-9_.]+-)?[A-Za-z0-9_]{8}(\.[a-z]+\.tmp)")  # (pid, target)


def shown(message: str, scratch: Path) -> str:
    """The message as the table shows it: the scratch directory as ``DIR``, the options list cut."""
    message = message.replace(str(scratch.resolve()), "DIR").replace(str(scratch), "DIR")
    message = TEMP_NAME.sub(r"\1XXXXXXXX\2", message)  # mkstemp's random part, so the table is reproducible
    # the plugins installed here (a third-party one, such as the example package CI installs) are not the row's
    message = re.sub(r"available plugins: [^.;]*", "available plugins: …", message)
    head, cut, _ = message.partition(". Allowed options: ")
    return head + (". Allowed options: …" if cut else "")


def table_row(number: int, case: Case, outcome: Outcome, message: str) -> str:
    """One row of the table in docs/reliability.md (``scripts/bad_inputs.py --markdown``)."""
    ok = outcome.kind == case.expect and case.names in message
    mark = "" if ok else " **UNEXPECTED**"
    return f"| {number} | {_cell(case.what)} | {outcome.stage} | {outcome.kind}{mark} | `{_cell(message)}` |"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def run_all(root: Path) -> Iterator[tuple[Case, Outcome, str]]:
    """Every case in its own scratch directory under ``root``: (case, outcome, the message as shown)."""
    for i, case in enumerate(CASES):
        scratch = root / f"case{i:02d}"
        scratch.mkdir(parents=True)
        outcome = attempt(case, scratch)
        yield case, outcome, shown(outcome.message, scratch)
        shutil.rmtree(scratch, ignore_errors=True)
