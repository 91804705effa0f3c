"""Checking diffusers-format model folders without loading them, and hashing their weights.

A diffusers folder holds ``model_index.json`` naming each component as ``[library, class]``,
and one sub-folder per component. Model components need ``config.json`` and safetensors
weights (a single file or an ``*.safetensors.index.json`` with its shards); pickle weights
(``.bin``, ``.pt``, ``.ckpt``) are refused because loading them can run code.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

from studio.paths import atomic_write_text, user_dir


class ModelError(ValueError):
    """A model cannot be used; the message names the model and the missing or bad file."""


# libraries whose components are models with weights: diffusers, transformers, and the
# diffusers pipeline packages with models of their own (LTX-2's text connectors and vocoder
# are saved as ["ltx2", "LTX2TextConnectors"] and ["ltx2", "LTX2Vocoder"])
_MODEL_LIBRARIES = {"diffusers", "transformers", "ltx2"}
_NON_MODEL_MARKERS = ("Scheduler", "Tokenizer", "TokenizersBackend", "Processor",
                      "FeatureExtractor")
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def read_json(path: Path, what: str) -> dict:
    """Reads a JSON object from ``path``; ModelError names the file when absent or bad."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"{what}: missing file {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{what}: {path} is not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ModelError(f"{what}: {path} is not a JSON object")
    return data


def check_safetensors(path: Path) -> int:
    """Checks a safetensors file's header and length without reading the tensors.

    Returns:
        The file size in bytes.
    Raises:
        ModelError: missing, truncated or not a safetensors file (names the file).
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ModelError(f"{path} is truncated (no safetensors header)")
            (n,) = struct.unpack("<Q", head)
            if n <= 0 or n > 100_000_000 or 8 + n > size:
                raise ModelError(f"{path} is not a valid safetensors file (bad header length)")
            header = json.loads(fh.read(n))
    except FileNotFoundError:
        raise ModelError(f"missing weights file {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{path} is not a valid safetensors file ({exc})") from None
    end = 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            end = max(end, int(meta["data_offsets"][1]))
        except (KeyError, TypeError, IndexError, ValueError):
            raise ModelError(f"{path} has a corrupt safetensors header ({name})") from None
    if 8 + n + end != size:
        raise ModelError(f"{path} is truncated or corrupt: {size} bytes on disk, "
                         f"{8 + n + end} expected")
    return size


def _check_plain_name(name: str, what: str) -> None:
    """A file or folder name a model's JSON gives must stay inside the model folder: one
    path part, not "." or ".." (links inside the folder, as the Hugging Face cache makes,
    are fine; the name is what is checked).

    Raises:
        ModelError: naming ``what`` and the name.
    """
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ModelError(f"{what} {name[:80]!r} is not a plain name inside the model folder "
                         f"(no '/', '..'); the folder is damaged or crafted")


def component_weight_files(folder: Path, component: str) -> list[Path]:
    """The safetensors files of one model component, checked.

    Raises:
        ModelError: no config, no weights, pickle-only weights, or a bad or missing shard.
    """
    _check_plain_name(component, f"{folder / 'model_index.json'}: component")
    sub = folder / component
    if not sub.is_dir():
        raise ModelError(f"missing component folder {sub}")
    read_json(sub / "config.json", component)
    files = sorted(p for p in sub.iterdir() if p.is_file())
    indexes = [p for p in files if p.name.endswith(".safetensors.index.json")]
    if indexes:
        index = read_json(indexes[0], component)
        shards = sorted(set(map(str, dict(index.get("weight_map", {})).values())))
        if not shards:
            raise ModelError(f"{indexes[0]} lists no weight shards")
        for shard in shards:
            _check_plain_name(shard, f"{indexes[0]}: weight shard")
        out = [sub / s for s in shards]
        for p in out:  # a shard must be a file here (a FIFO or a folder would hang or fail)
            if not p.is_file():
                raise ModelError(f"{indexes[0]} names the shard {p.name}, which is not a "
                                 f"file in {sub}")
    else:
        out = [p for p in files if p.suffix == ".safetensors"]
        plain = [p for p in out if not _is_variant(p)]
        # diffusers loads the plain files when there are any (both sets would count twice
        # in size and hash); a folder saved with variant="fp16" has only *.fp16.safetensors
        out = plain or out
    if not out:
        if any(p.suffix in _PICKLE_SUFFIXES for p in files):
            raise ModelError(f"{sub} has only pickle weights (.bin/.pt); convert them to "
                             f"safetensors: pickle files can run code when loaded")
        raise ModelError(f"{sub} has no weights (*.safetensors)")
    for p in out:
        check_safetensors(p)
    return out


def _is_variant(path: Path) -> bool:
    """Whether a weights file is a diffusers variant (``*.fp16.safetensors``; sharded:
    ``*-00001-of-00002.fp16.safetensors``)."""
    return path.name.endswith(VARIANT_SUFFIXES)


VARIANT_SUFFIXES = (".fp16.safetensors", ".bf16.safetensors")


def folder_variant(files: list[Path]) -> str | None:
    """The variant to pass to ``from_pretrained`` (``"fp16"``, ``"bf16"``) when a component's
    checked weights are variant files only (a folder saved with ``variant=...``); None when
    every component has plain files."""
    for p in files:
        if _is_variant(p):
            return p.name.rsplit(".", 2)[-2]
    return None


def check_folder(folder: Path) -> tuple[dict, list[Path]]:
    """Checks a diffusers folder's index, configs and weights.

    Returns:
        (model_index, every weights file).
    Raises:
        ModelError: the first missing or bad file, named.
    """
    if folder.exists() and not folder.is_dir():
        raise ModelError(f"{folder} is a file, not a model folder (a diffusers folder holds "
                         f"model_index.json)")
    if not folder.is_dir():
        raise ModelError(f"model folder {folder} does not exist")
    index = read_json(folder / "model_index.json", str(folder))
    weights: list[Path] = []
    for name, spec in sorted(index.items()):
        if name.startswith("_") or not isinstance(spec, list) or len(spec) != 2:
            continue
        library, cls = spec
        if library is None or cls is None:
            continue
        _check_plain_name(name, f"{folder / 'model_index.json'}: component")
        sub = folder / name
        if library in _MODEL_LIBRARIES and not any(m in str(cls) for m in _NON_MODEL_MARKERS):
            weights += component_weight_files(folder, name)
        elif not sub.is_dir() or not any(sub.iterdir()):
            raise ModelError(f"missing component folder {sub} ({cls})")
        elif str(cls).endswith("Scheduler"):
            read_json(sub / "scheduler_config.json", name)
    return index, weights


def folder_size(folder: Path) -> int:
    """Bytes on disk under ``folder``: linked files count at their target's size (the HF
    cache links each file to its blob); linked folders are not entered (a link to ``/`` or
    ``..`` in a damaged model folder made the scan walk the disk, or loop for ever)."""
    total = 0
    for root, _dirs, files in os.walk(folder, followlinks=False):
        for f in files:
            try:
                total += (Path(root) / f).stat().st_size
            except OSError:
                pass
    return total


def weights_hash(folder: Path, files: list[Path]) -> str:
    """blake2b-128 over the weights files' relative names and bytes.

    Cached per file by (path, size, mtime) in the user folder, so a 20 GB checkpoint is read
    once, not on every run.
    """
    cache_path = user_dir() / "weights-hashes.json"
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    total = hashlib.blake2b(digest_size=16)
    changed = False
    for p in sorted(files):
        st = p.stat()
        key = f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}"
        digest = cache.get(key)
        if digest is None:
            h = hashlib.blake2b(digest_size=16)
            with open(p, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 22), b""):
                    h.update(chunk)
            digest = cache[key] = h.hexdigest()
            changed = True
        total.update(str(p.relative_to(folder)).encode() + b"\0" + digest.encode())
    if changed:
        try:
            atomic_write_text(cache_path, json.dumps(cache))
        except OSError:
            pass  # a read-only home only costs re-hashing next time
    return total.hexdigest()
