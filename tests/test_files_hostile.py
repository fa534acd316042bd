"""Issue 67: files, folders and values a user or a neighbour may hand freespec on purpose or by accident.

Planted symlinks in shared folders, builds killed by SIGKILL, bad records, one huge paragraph, control
characters in files a command prints, and booleans where a number is wanted."""
from __future__ import annotations

import json
import os
import types
import typing

import pytest

from freespec.proposers.registry import available_plugins, load_proposer_class


# --------------------------------------------------------------------------- booleans are not numbers


def _number_field(annotation) -> bool:
    """``int``/``float`` and their optional forms (the test's own reading of an annotation)."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _number_field(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return all(_number_field(a) for a in args)
    return annotation in (int, float)


def _numeric_fields():
    for plugin in sorted(available_plugins()):
        options = load_proposer_class(plugin).Options
        for name, field in options.model_fields.items():
            if _number_field(field.annotation):
                yield plugin, options, name


NUMERIC_FIELDS = list(_numeric_fields())


def test_every_plugin_has_numeric_options_to_check():
    assert {plugin for plugin, _, _ in NUMERIC_FIELDS} >= {"copy", "recycle", "retrieval", "hybrid"}


@pytest.mark.parametrize("plugin,options,name", NUMERIC_FIELDS, ids=[f"{p}.{n}" for p, _, n in NUMERIC_FIELDS])
@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_is_refused_where_a_number_is_wanted_naming_the_field(plugin, options, name, value):
    with pytest.raises(ValueError, match=f"{name}.*boolean is never taken as a number"):
        options.model_validate({name: value})


def test_a_boolean_inside_a_list_of_numbers_is_refused_and_real_booleans_still_pass():
    from freespec.proposers.recycle.proposer import RecycleOptions

    with pytest.raises(ValueError, match="tree_widths.*boolean"):
        RecycleOptions.model_validate({"tree_widths": [4, True]})
    bool_fields = [n for n, f in RecycleOptions.model_fields.items() if f.annotation is bool]
    assert bool_fields and RecycleOptions.model_validate({bool_fields[0]: True})
    assert typing.get_origin(RecycleOptions.model_fields["tree_widths"].annotation) is not None


# --------------------------------------------------------------------------- printing what a file says

FORGERY = "chars\x1b[2K\r\nfreespec: all checks passed\x07\u202e\x9b"


def char_tokenize(texts):
    return [[ord(c) % 1000 for c in t] for t in texts]


def small_datastore(tmp_path, name="ds", texts=("the quick brown fox", "jumps over the lazy dog"), **kwargs):
    from freespec.proposers.retrieval.build import build_datastore

    corpus = tmp_path / f"{name}.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    options = dict(tokenizer_name="chars", fingerprint="sha256:chars", vocab_size=1000, progress=False)
    options.update(kwargs)
    build_datastore([str(corpus)], tmp_path / name, char_tokenize, **options)
    return tmp_path / name


def _no_terminal_controls(text: str) -> None:
    """None of the forgery's controls reached the terminal raw (a progress bar's own ``\\r`` is fine)."""
    bad = [c for c in text if c in "\x1b\x07\u202e\x9b"]
    assert not bad, f"raw control characters printed: {bad!r}"
    assert not any(line.lstrip("\r").startswith("freespec: all checks passed") for line in text.splitlines())


def test_datastore_info_and_verify_escape_what_the_manifest_says(tmp_path, capsys):
    from freespec.cli.main import main

    store = small_datastore(tmp_path)
    manifest = json.loads((store / "manifest.json").read_text())
    manifest["tokenizer"]["name"] = FORGERY
    manifest["created"] = FORGERY
    manifest["sources"] = [FORGERY]
    (store / "manifest.json").write_text(json.dumps(manifest))
    assert main(["datastore", "info", str(store)]) == 0
    out = capsys.readouterr()
    _no_terminal_controls(out.out + out.err)
    assert "\\x1b[2K" in out.out and "all checks passed" in out.out
    assert not any(line.startswith("freespec: all checks passed") for line in out.out.splitlines())

    (store / "shard-00000.tokens").write_bytes(b"\0" * (store / "shard-00000.tokens").stat().st_size)
    manifest["shards"][0]["tokens_sha256"] = FORGERY
    (store / "manifest.json").write_text(json.dumps(manifest))
    assert main(["datastore", "verify", str(store)]) == 1
    out = capsys.readouterr()
    _no_terminal_controls(out.out + out.err)


def test_doctor_models_recycle_and_responses_escape_what_they_print(tmp_path, capsys, monkeypatch):
    from freespec.cli.main import main
    from freespec.vllm_plugins import doctor

    monkeypatch.setattr(doctor, "diagnose", lambda: {})
    # An entry point's name is one line of entry_points.txt: it may hold any control but a line break.
    name = FORGERY.replace("\n", "")
    monkeypatch.setattr(doctor, "report", lambda data: f"plugins:\n  {name} (other.pkg:Class): usable")
    assert main(["doctor"]) == 0
    out = capsys.readouterr()
    _no_terminal_controls(out.out + out.err)
    assert "plugins:\n" in out.out

    assert main(["models", "list", "--cache-dir", str(tmp_path / FORGERY.replace("/", ""))]) == 0
    out = capsys.readouterr()
    _no_terminal_controls(out.out + out.err)

    bad = tmp_path / f"{FORGERY}.npz"
    bad.write_bytes(b"not a zip")
    assert main(["recycle", "info", str(bad)]) == 2
    out = capsys.readouterr()
    _no_terminal_controls(out.out + out.err)

    assert main(["responses", "build", "--model", "x", "--prompts", str(bad.with_suffix(".jsonl")),
                 "--out", str(tmp_path / "missing" / "r.bin")]) == 2
    out = capsys.readouterr()
    _no_terminal_controls(out.out + out.err)


def test_printable_escapes_controls_and_keeps_ordinary_text():
    from freespec.safe_files import printable

    assert printable("naïve 日本 tab\tend") == "naïve 日本 tab\\x09end"
    assert printable("a\nb\x1b", newlines=True) == "a\nb\\x1b"
    assert printable("\ud800\u2028\u200b") == "\\ud800\\u2028\\u200b"


# --------------------------------------------------------------------------- planted links


def test_create_new_and_lock_files_never_write_through_a_planted_link(tmp_path):
    from freespec.safe_files import PlantedLinkError, create_new, open_lock_file

    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / "new").symlink_to(victim)
    (tmp_path / "lock").symlink_to(victim)
    (tmp_path / "dangling").symlink_to(tmp_path / "not-yet")
    with pytest.raises(FileExistsError):
        create_new(tmp_path / "new")
    with pytest.raises(FileExistsError):
        create_new(tmp_path / "dangling")
    with pytest.raises(PlantedLinkError, match="lock.*symbolic link"):
        open_lock_file(tmp_path / "lock")
    assert victim.read_text() == "keep me" and not (tmp_path / "not-yet").exists()
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(PlantedLinkError, match="FIFO"):
        open_lock_file(tmp_path / "fifo")


# --------------------------------------------------------------------------- bad records


def utf8_tokenize(texts):
    """Like a Hugging Face tokenizer: the text goes to native code as UTF-8 (a lone surrogate cannot)."""
    return [[b % 1000 for b in t.encode("utf-8")] for t in texts]


def _records(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


LONE_SURROGATE = [json.dumps({"text": "first record"}), '{"text": "bad \\ud800 half of a pair"}',
                  json.dumps({"text": "third record"})]


def test_a_record_with_a_lone_surrogate_is_refused_naming_the_file_and_line(tmp_path):
    from freespec.proposers.retrieval.build import build_datastore
    from freespec.proposers.retrieval.readers import InputError

    corpus = _records(tmp_path / "chats.jsonl", LONE_SURROGATE)
    with pytest.raises(InputError, match=r"chats\.jsonl: line 2: .*lone surrogate U\+D800"):
        build_datastore([str(corpus)], tmp_path / "ds", utf8_tokenize, tokenizer_name="bytes",
                        fingerprint="f", vocab_size=1000, progress=False)
    assert not (tmp_path / "ds").exists()


def test_bad_records_are_skipped_and_counted_on_request_keeping_the_others(tmp_path):
    from freespec.proposers.retrieval.build import build_datastore

    corpus = _records(tmp_path / "chats.jsonl", LONE_SURROGATE + ["{not json", json.dumps({"x": 1}),
                                                                   json.dumps({"text": "last record"})])
    chat = tmp_path / "chat.json"
    chat.write_text('[{"text": "a json record"}, {"text": "\\udfff"}, {"text": "another"}]')
    manifest = build_datastore([str(corpus), str(chat)], tmp_path / "ds", utf8_tokenize, tokenizer_name="bytes",
                               fingerprint="f", vocab_size=1000, progress=False, skip_bad_records=True)
    assert manifest["skipped_records"] == 4 and manifest["documents"] == 5
    texts = ["first record", "third record", "last record", "a json record", "another"]
    assert manifest["total_tokens"] == sum(len(t) + 1 for t in texts)


def test_a_text_the_tokenizer_refuses_is_named_or_skipped(tmp_path):
    from freespec.proposers.retrieval.build import build_datastore
    from freespec.proposers.retrieval.readers import InputError

    def picky(texts):
        if any("forbidden" in t for t in texts):
            raise TypeError("TextEncodeInput must be Union[TextInputSequence, ...]")
        return utf8_tokenize(texts)

    corpus = _records(tmp_path / "a.jsonl", [json.dumps({"text": t}) for t in ("fine", "forbidden", "also fine")])
    with pytest.raises(InputError, match=r"a\.jsonl: line 2: the tokenizer refused this text \(TypeError"):
        build_datastore([str(corpus)], tmp_path / "ds", picky, tokenizer_name="b", fingerprint="f",
                        vocab_size=1000, progress=False)
    manifest = build_datastore([str(corpus)], tmp_path / "ds", picky, tokenizer_name="b", fingerprint="f",
                               vocab_size=1000, progress=False, skip_bad_records=True)
    assert manifest["documents"] == 2 and manifest["skipped_records"] == 1


def _fixture_tokenizer():
    from freespec import model_store

    spec = model_store.MODELS[model_store.DEFAULT_MODEL]
    path = model_store.model_dir(spec.name)
    if not model_store.is_prepared(spec, path):
        pytest.skip(f"{spec.name} is not prepared (freespec models prepare)")
    return str(path)


def test_the_cli_names_the_bad_record_or_skips_it_with_the_real_tokenizer(tmp_path, capsys):
    from freespec.cli.main import main

    model = _fixture_tokenizer()
    corpus = _records(tmp_path / "chats.jsonl", LONE_SURROGATE)
    args = ["datastore", "build", "--tokenizer", model, "--input", str(corpus), "--out", str(tmp_path / "ds")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "chats.jsonl: line 2" in err and "surrogate" in err
    assert main([*args, "--skip-bad-records"]) == 0
    captured = capsys.readouterr()
    assert "1 bad record(s) skipped" in captured.err and captured.out.strip().endswith("ds")


# --------------------------------------------------------------------------- memory bounded by options

MEMORY_CHILD = """
import json, random, sys
from freespec.proposers.retrieval.build import build_datastore

out, model, size, shape = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if model == "python":  # a pure-Python tokenizer: a list of Python ints per text, as tokenizers return
    def tokenize(texts):
        return [[ord(c) % 1000 for c in t] for t in texts]
    vocab = 1000
else:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model)
    def tokenize(texts):
        return tok(texts, add_special_tokens=False, return_attention_mask=False, verbose=False)["input_ids"]
    vocab = len(tok)
words = "the quick brown fox jumps over the lazy dog while 12345 and {}[] appear".split()
random.seed(0)
small, big = out + ".small.txt", out + (".big.txt" if shape == "paragraph" else ".big.json")
with open(small, "w") as f:
    f.write(" ".join(random.choice(words) for _ in range(20000)) + "\\n")
with open(big, "w") as f:
    if shape == "paragraph":  # one paragraph, one line
        while f.tell() < size:
            f.write(" ".join(random.choice(words) for _ in range(100000)) + " ")
        f.write("\\n")
    else:  # a .json list of many short records
        f.write("[")
        while f.tell() < size:
            f.write(",".join(json.dumps({"text": " ".join(random.sample(words, 3))}) for _ in range(10000)) + ",")
        f.write('"the end"]')
options = dict(tokenizer_name="t", fingerprint="f", vocab_size=vocab, progress=False, shard_tokens=1 << 20)
build_datastore([small], out + ".warm", tokenize, **options)  # everything loaded, warmed up


def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


# The peak is this process's own from here (ru_maxrss would carry the parent's over fork and exec).
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS")
manifest = build_datastore([big], out, tokenize, **options)
growth = status("VmHWM") - before
print(json.dumps({"growth": growth, "tokens": manifest["total_tokens"], "documents": manifest["documents"]}))
"""


@pytest.mark.parametrize("tokenizer,size,shape", [("python", 8 << 20, "paragraph"), ("fixture", 3 << 20, "paragraph"),
                                                  ("python", 12 << 20, "json")])
def test_a_huge_paragraph_or_json_file_stays_within_the_documented_memory_bound(tmp_path, tokenizer, size, shape):
    import subprocess
    import sys

    from freespec.proposers.retrieval.build import MEMORY_BOUND_BYTES, SHARD_BYTES_PER_TOKEN

    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux's /proc/self/clear_refs to measure a peak")

    model = "python" if tokenizer == "python" else _fixture_tokenizer()
    done = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(tmp_path / "ds"), model, str(size), shape],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["documents"] == 1 or shape == "json"
    assert result["tokens"] > size // 8
    bound = SHARD_BYTES_PER_TOKEN * (1 << 20) + MEMORY_BOUND_BYTES  # docs/datastore.md, "Memory"
    assert result["growth"] < bound, f"{result['growth'] / 2**20:.0f} MiB for a {size >> 20} MiB {shape}"


def _paragraphs(text: str) -> list[str]:
    """The .txt reader's documents, the plain way: the whole file in memory."""
    docs, lines = [], []
    for line in text.lstrip("\ufeff").splitlines():
        if line.strip():
            lines.append(line)
        elif lines:
            docs.append("\n".join(lines))
            lines = []
    return docs + (["\n".join(lines)] if lines else [])


@pytest.mark.parametrize("chunk,piece", [(7, 5), (64, 16), (1 << 20, 1 << 16)])
def test_bounded_reading_gives_the_documents_whole_reading(tmp_path, monkeypatch, chunk, piece):
    from freespec.proposers.retrieval import readers

    monkeypatch.setattr(readers, "READ_CHUNK", chunk)
    monkeypatch.setattr(readers, "PIECE_CHARS", piece)
    rng = __import__("random").Random(chunk)
    alphabet = ["a", "b", " ", "é", "日本", "\n", "\n", "\r\n", "  \n", "\t"]
    text = "\ufeff" + "".join(rng.choice(alphabet) for _ in range(3000)) + "x" * 200
    (tmp_path / "a.txt").write_bytes(text.encode("utf-8"))
    assert list(readers.iter_documents(tmp_path / "a.txt")) == _paragraphs(text)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_bytes(text.encode("utf-8"))
    assert list(readers.iter_documents(tmp_path / "src")) == [text.lstrip("\ufeff")]
    records = [{"text": text[i : i + 300]} for i in range(0, 3000, 300)] + [{"messages": [{"content": "日本"}]}]
    for name, data in (("l.json", records), ("d.json", {"meta": [1, {"x": "]"}], "data": records, "n": None})):
        (tmp_path / name).write_text(json.dumps(data, ensure_ascii=bool(chunk % 2)), encoding="utf-8")
        expected = [t for t in (r.get("text") or "日本" for r in records) if t]
        assert list(readers.iter_documents(tmp_path / name)) == expected
    pieces = list(readers.read_file(tmp_path / "a.txt", None, print))
    assert all(p.text is None or len(p.text) <= piece for p in pieces)
    assert sum(p.nbytes for p in pieces) == len(text.encode("utf-8"))


@pytest.mark.parametrize("shard_tokens", [37, 1000, 1 << 20])
def test_documents_in_pieces_build_the_same_datastore_as_whole_ones(tmp_path, monkeypatch, shard_tokens):
    import random

    from freespec.proposers.retrieval import readers
    from freespec.proposers.retrieval.build import build_datastore

    rng = random.Random(shard_tokens)
    texts = ["".join(rng.choice("ab c\n") for _ in range(rng.choice([1, 5, 30, 36, 90]))).strip() or "z"
             for _ in range(60)]
    corpus = _records(tmp_path / "c.jsonl", [json.dumps({"text": t}) for t in texts])
    (tmp_path / "p.txt").write_text("one paragraph " * 40 + "\n\n" + "x" * 75 + "\n")
    options = dict(tokenizer_name="c", fingerprint="f", vocab_size=1000, progress=False, shard_tokens=shard_tokens)
    whole = build_datastore([str(corpus), str(tmp_path / "p.txt")], tmp_path / "whole", char_tokenize, **options)
    monkeypatch.setattr(readers, "PIECE_CHARS", 7)
    pieces = build_datastore([str(corpus), str(tmp_path / "p.txt")], tmp_path / "pieces", char_tokenize, **options)
    assert pieces["shards"] == whole["shards"] and pieces["documents"] == whole["documents"] == 62


def test_links_planted_beside_a_datastore_are_neither_followed_nor_removed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    (tmp_path / ".ds.building-1-planted").symlink_to(outside)
    (tmp_path / ".ds.old-planted").symlink_to(outside)
    (tmp_path / ".ds.building-2-file").write_text("not a folder")
    small_datastore(tmp_path)
    assert (outside / "precious").read_text() == "keep me"
    assert (tmp_path / ".ds.building-1-planted").is_symlink() and (tmp_path / ".ds.old-planted").is_symlink()
    assert (tmp_path / ".ds.building-2-file").read_text() == "not a folder"
    (tmp_path / "ds2").symlink_to(outside)
    from freespec.proposers.retrieval.readers import BuildError

    with pytest.raises(BuildError, match="ds2 exists and is not a directory"):
        small_datastore(tmp_path, "ds2")
    assert sorted(p.name for p in outside.iterdir()) == ["precious"]
