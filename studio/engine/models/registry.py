"""The model registry: the embedded default, local diffusers folders and the HF cache.

Model ids:

* ``embedded`` (or the embedded model's folder name): the default model in ``assets/models``.
* a path to a diffusers-format folder (holding ``model_index.json``).
* ``org/name``: a model in the Hugging Face cache layout
  (``$HF_HUB_CACHE`` or ``~/.cache/huggingface/hub``: ``models--org--name/snapshots/<rev>``,
  the revision that ``refs/main`` names, else the newest snapshot).
* the name of a folder directly inside one of the configured model folders.

Nothing here touches the network or loads weights: listing and resolving only read JSON
configs and safetensors headers. Loading happens in :mod:`studio.engine.models.loading`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from studio.core.capabilities import ModelCapabilities
from studio.engine.models.families import capabilities_for, family_of
from studio.engine.models.folders import (
    ModelError,
    check_folder,
    check_safetensors,
    folder_size,
    folder_variant,
    read_json,
    weights_hash,
)
from studio.paths import ASSETS


def _files_size(files: list[Path]) -> int:
    """Bytes of the weights files a folder loads (its other files and unused copies, such
    as a second variant or the original-format checkpoints beside, do not count)."""
    total = 0
    for p in files:
        try:
            total += p.stat().st_size
        except OSError:
            pass
    return total


#: the key names of LoRA adapter weights (PEFT/diffusers, kohya): lora_A/B, lora_down/up
LORA_KEY = re.compile(r"(^|[._])lora(_[AB]|_down|_up|\.down|\.up)([._]|$)")

EMBEDDED_ID = "embedded"
EMBEDDED_DIR = ASSETS / "models"
DEFAULT_EMBEDDED = "tiny-wan"


@dataclass(frozen=True)
class ModelEntry:
    """One model the registry knows, usable or not.

    Attributes:
        model_id: how requests name it.
        path: the diffusers folder.
        family: e.g. ``wan``, ``flux``; ``unknown`` when not recognised.
        source: ``embedded``, ``folder`` or ``hf-cache``.
        size_bytes: bytes on disk.
        dtype: dtype of the stored weights (from the safetensors headers), e.g. ``bfloat16``.
        capabilities: the modes and rules; None when unusable.
        error: why it cannot be used (empty when usable).
        pipeline_class: diffusers pipeline class named in model_index.json.
        call_kwargs: extra pipeline-call arguments from the folder's ``studio.json``.
        description: one line about the model, from ``studio.json``.
        tuning: per-model optimization settings from ``studio.json`` (``step_cache``,
            ``guidance_reuse``, ``attention``).
        denoiser_file: a single-file denoiser checkpoint run on this folder's other
            components (:mod:`studio.engine.models.single_file`); None for a plain folder.
        denoiser_subfolder: the folder's component it replaces (``transformer``/``unet``).
        denoiser_class: its diffusers class name.
        reference_encoder: subfolder of an image encoder whose tokens a reference image
            adds to the prompt embeddings (``studio.json``'s ``reference_tokens``; see
            :func:`studio.engine.pipelines.wan.reference_tokens`); empty when none.
        reference_words: ``{"map": <file under the folder>, "placeholder": <word>}``, the
            reference's pseudo-words (``studio.json``'s ``reference_words``; see
            :class:`studio.engine.pipelines.wan.ReferenceWords`); empty when none.
    """

    model_id: str
    path: Path
    family: str = "unknown"
    source: str = "folder"
    size_bytes: int = 0
    dtype: str = ""
    capabilities: ModelCapabilities | None = None
    error: str = ""
    pipeline_class: str = ""
    index: dict = field(default_factory=dict, compare=False, repr=False)
    call_kwargs: dict = field(default_factory=dict, compare=False)
    description: str = ""
    tuning: dict = field(default_factory=dict, compare=False)
    denoiser_file: Path | None = None
    denoiser_subfolder: str = ""
    denoiser_class: str = ""
    reference_encoder: str = ""
    reference_words: dict = field(default_factory=dict, compare=False)
    variant: str | None = None

    @property
    def load_key(self) -> str:
        """What identifies the loaded weights (the folder, and the single file if any)."""
        return str(self.path) + (f"|{self.denoiser_file}" if self.denoiser_file else "")

    @property
    def usable(self) -> bool:
        return not self.error and self.capabilities is not None


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache folder, by the same environment variables as huggingface_hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    hf_home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "huggingface")
    return Path(hf_home) / "hub"


def _hf_snapshot(repo_dir: Path) -> Path | None:
    ref = repo_dir / "refs" / "main"
    snaps = repo_dir / "snapshots"
    if ref.is_file():
        candidate = snaps / ref.read_text().strip()
        if candidate.is_dir():
            return candidate
    if snaps.is_dir():
        found = sorted((p for p in snaps.iterdir() if p.is_dir()),
                       key=lambda p: p.stat().st_mtime, reverse=True)
        if found:
            return found[0]
    return None


def _stored_dtype(files: list[Path]) -> str:
    names = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn",
             "F8_E5M2": "float8_e5m2", "I8": "int8", "U8": "uint8"}
    counts: dict[str, int] = {}
    for p in files:
        try:
            with open(p, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(n))
        except (OSError, ValueError):
            continue
        for key, meta in header.items():
            if key != "__metadata__":
                begin, end = meta["data_offsets"]
                counts[meta["dtype"]] = counts.get(meta["dtype"], 0) + end - begin
    if not counts:
        return ""
    return names.get(max(counts, key=counts.get), max(counts, key=counts.get).lower())



def _expand(folder: str | os.PathLike[str]) -> Path:
    """``folder`` with ``~`` expanded; as given when ``~user`` names no user (it is then
    reported as a folder that does not exist, not raised)."""
    from studio.paths import expand_path

    try:
        return expand_path(folder, "model folder")
    except ValueError:
        return Path(folder)

#: files that make a folder worth inspecting as a model (a broken one included)
MODEL_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf")
MODEL_FILE_NAMES = ("model_index.json", "config.json", "studio.json")


def _may_be_model(folder: Path) -> bool:
    """Whether ``folder`` (a sub-folder of a model folder) holds anything of a model, at its
    top or one level down: a diffusers index, a config, or weights. A folder of pictures or
    documents beside the models is not listed as an unusable model; a model missing a
    file still is, with the reason. Unreadable folders count (their entry says why)."""
    try:
        for entry in os.scandir(folder):
            if entry.name in MODEL_FILE_NAMES or entry.name.endswith(MODEL_FILE_SUFFIXES):
                return True
            if entry.is_dir():
                try:
                    if any(e.name in MODEL_FILE_NAMES or e.name.endswith(MODEL_FILE_SUFFIXES)
                           for e in os.scandir(entry.path)):
                        return True
                except OSError:
                    continue
    except OSError:
        return True
    return False


class ModelRegistry:
    """Finds models and checks them before anything is loaded.

    Args:
        model_folders: folders whose sub-folders are diffusers models (the user's settings).
        include_hf_cache: also list models in the Hugging Face cache.
        embedded_dir: where the embedded models are (default ``assets/models``).
    """

    def __init__(self, model_folders: list[str | os.PathLike[str]] | None = None, *,
                 include_hf_cache: bool = True, embedded_dir: Path | None = None):
        self.model_folders = [_expand(p) for p in (model_folders or [])]
        self.include_hf_cache = include_hf_cache
        self.embedded_dir = embedded_dir or EMBEDDED_DIR
        self._hash_cache: dict[Path, str] = {}

    # -- discovery --------------------------------------------------------------------------
    def list(self) -> list[ModelEntry]:
        """Every model found, usable or not (an unusable one carries its ``error``).

        A folder that cannot be read is listed with the reason; it never stops the scan.
        """
        entries: list[ModelEntry] = []
        singles: list[Path] = []
        if self.embedded_dir.is_dir():
            for sub in sorted(self.embedded_dir.iterdir()):
                if sub.is_dir():
                    mid = EMBEDDED_ID if sub.name == DEFAULT_EMBEDDED else sub.name
                    entries.append(self.inspect(sub, model_id=mid, source="embedded"))
        for folder in self.model_folders:
            try:
                subs = sorted(p for p in folder.iterdir() if p.is_dir())
            except OSError as exc:
                entries.append(ModelEntry(str(folder), folder,
                                          error=f"cannot read folder: {exc.strerror}"))
                continue
            if (folder / "model_index.json").exists():
                # a model folder itself: its top-level .safetensors (FLUX.1-dev's
                # flux1-dev.safetensors and ae.safetensors, LTX's checkpoints) are that
                # model's original-format copies, not single-file models of their own
                entries.append(self.inspect(folder, model_id=str(folder), source="folder"))
                continue
            for sub in subs:
                if _may_be_model(sub):  # a folder of pictures is no model, not a broken one
                    entries.append(self.inspect(sub, model_id=str(sub), source="folder"))
            try:
                singles += sorted(p for p in folder.iterdir()
                                  if p.suffix == ".safetensors" and p.is_file())
            except OSError:
                pass
        if self.include_hf_cache:
            cache = hf_cache_dir()
            try:
                repos = sorted(p for p in cache.iterdir() if p.name.startswith("models--"))
            except OSError:
                repos = []
            for repo in repos:
                mid = repo.name[len("models--"):].replace("--", "/")
                snap = _hf_snapshot(repo)
                if snap is None:
                    entries.append(ModelEntry(mid, repo, source="hf-cache",
                                              error="no downloaded snapshot"))
                elif (snap / "model_index.json").exists():
                    entries.append(self.inspect(snap, model_id=mid, source="hf-cache"))
        bases = [e for e in entries if not e.error]
        entries += [self.inspect_single_file(p, bases) for p in singles]
        return entries

    def inspect_single_file(self, file: Path, bases: list[ModelEntry]) -> ModelEntry:
        """Checks a single-file denoiser checkpoint and pairs it with the first of ``bases``
        whose denoiser has its layout; never raises (the entry carries the error)."""
        from studio.engine.models.single_file import find_base, read_header

        mid = str(file)
        size = file.stat().st_size if file.exists() else 0
        try:
            header = read_header(file)
            adapters = [k for k in header if LORA_KEY.search(k)]
            if adapters and len(adapters) * 2 >= len(header):  # a LoRA, not a model
                return ModelEntry(mid, file, source="single-file", size_bytes=size, error=(
                    f"a LoRA ({len(adapters)} adapter weights), not a model: LoRAs are not "
                    f"supported yet; keep the file out of the model folders to hide this entry"))
            found = find_base(file, bases)
        except ModelError as exc:
            return ModelEntry(mid, file, source="single-file", size_bytes=size, error=str(exc))
        if found is None:
            return ModelEntry(mid, file, source="single-file", size_bytes=size, error=(
                f"a single-file denoiser runs on a diffusers folder of the same model (its "
                f"text encoders, VAE and configs); none of the {len(bases)} usable model(s) "
                f"found has a denoiser of this file's layout"))
        base, sub, cls = found
        counts: dict[str, int] = {}
        for dtype, shape in header.values():
            n = 1
            for d in shape:
                n *= d
            counts[dtype] = counts.get(dtype, 0) + n
        names = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
        dtype = names.get(max(counts, key=counts.get), "") if counts else ""
        return replace(base, model_id=mid, source="single-file", size_bytes=size,
                       dtype=dtype, denoiser_file=file, denoiser_subfolder=sub,
                       denoiser_class=cls, description=f"{file.name} on {base.model_id}")

    def inspect(self, folder: Path, *, model_id: str | None = None,
                source: str = "folder") -> ModelEntry:
        """Checks one folder; never raises for a bad folder (the entry carries the error)."""
        mid = model_id or str(folder)
        try:
            index, files = check_folder(folder)
        except ModelError as exc:
            return ModelEntry(mid, folder, source=source, error=str(exc),
                              size_bytes=folder_size(folder) if folder.is_dir() else 0)
        except OSError as exc:
            return ModelEntry(mid, folder, source=source, error=f"unreadable: {exc}")
        cls = str(index.get("_class_name", ""))
        family = family_of(cls)
        entry = ModelEntry(mid, folder, family=family, source=source,
                           size_bytes=_files_size(files) or folder_size(folder),
                           dtype=_stored_dtype(files),
                           pipeline_class=cls, index=index, variant=folder_variant(files))
        studio_json = folder / "studio.json"
        try:
            extra = read_json(studio_json, mid) if studio_json.exists() else {}
        except ModelError as exc:  # listed as unusable; the scan goes on
            return replace(entry, error=str(exc))
        try:
            caps = capabilities_for(family, folder, index, name=mid, extra=extra)
            data = dict(extra.get("capabilities", {}))
            modes = data.pop("modes", None)
            caps = replace(caps, **{k: (tuple(v) if isinstance(v, list) else v)
                                    for k, v in data.items()})
        except ModelError as exc:
            return replace(entry, error=str(exc))
        except (TypeError, ValueError) as exc:  # a studio.json with unknown or bad fields
            return replace(entry, error=f"{studio_json}: {exc}")
        if modes is not None:
            if not isinstance(modes, list) or not all(isinstance(m, str) for m in modes):
                return replace(entry, error=f"{studio_json}: capabilities.modes={modes!r} must "
                                            f"be a list of mode names")
            caps = replace(caps, modes=frozenset(modes) & caps.modes)
        why = _capabilities_error(caps)
        if why:
            return replace(entry, error=f"{studio_json}: capabilities.{why}")
        why = _attention_tuning_error(extra.get("attention"))
        if why:
            return replace(entry, error=f"{studio_json}: attention: {why}")
        ref_enc = extra.get("reference_tokens", "")
        if ref_enc and (not isinstance(ref_enc, str) or "/" in ref_enc or "\\" in ref_enc
                        or ref_enc.startswith(".")
                        or not (folder / ref_enc / "config.json").is_file()):
            return replace(entry, error=f"{studio_json}: reference_tokens={ref_enc!r} is not a "
                                        f"subfolder with a config.json")
        ref_words = extra.get("reference_words", {})
        if "reference_words" in extra:  # declared: it must be usable (null and {} are not)
            why = _reference_words_error(folder, ref_words, ref_enc)
            if why:
                return replace(entry, error=f"{studio_json}: reference_words: {why}")
        return replace(entry, capabilities=caps, call_kwargs=dict(extra.get("call_kwargs", {})),
                       reference_encoder=ref_enc, reference_words=dict(ref_words),
                       description=str(extra.get("description", "")),
                       tuning={k: extra[k] for k in ("step_cache", "guidance_reuse", "attention")
                               if k in extra})

    # -- resolving --------------------------------------------------------------------------
    def resolve(self, model_id: str) -> ModelEntry:
        """The usable entry for ``model_id``.

        Raises:
            ModelError: unknown id, or a missing, partial or corrupt folder (names the file).
        """
        if not isinstance(model_id, str) or not model_id.strip():
            raise ModelError("model: no model named (see `studio models`)")
        candidates: list[tuple[Path, str, str]] = []
        if model_id in (EMBEDDED_ID, ""):
            candidates.append((self.embedded_dir / DEFAULT_EMBEDDED, EMBEDDED_ID, "embedded"))
        elif (self.embedded_dir / model_id).is_dir() and "/" not in model_id:
            candidates.append((self.embedded_dir / model_id, model_id, "embedded"))
        path = Path(model_id).expanduser()
        if path.suffix == ".safetensors" and path.is_file():  # a single-file denoiser
            entry = self.inspect_single_file(path, [e for e in self.list()
                                                    if not e.error and not e.denoiser_file])
            if entry.error:
                raise ModelError(f"model {model_id}: {entry.error}")
            return entry
        path_like = model_id.startswith(("/", ".", "~")) or path.exists()
        if path_like:
            candidates.append((path, model_id, "folder"))
        for folder in self.model_folders:
            if (folder / model_id).is_dir():
                candidates.append((folder / model_id, model_id, "folder"))
        if model_id.count("/") == 1 and not path_like:
            repo = hf_cache_dir() / ("models--" + model_id.replace("/", "--"))
            snap = _hf_snapshot(repo) if repo.is_dir() else None
            if snap is not None:
                candidates.append((snap, model_id, "hf-cache"))
        if not candidates:
            raise ModelError(f"model: {model_id!r} is not a model folder, an embedded model or "
                             f"a model in the Hugging Face cache (nothing is downloaded; see "
                             f"`studio models`)")
        folder, mid, source = candidates[0]
        entry = self.inspect(folder, model_id=mid, source=source)
        if entry.error:
            raise ModelError(f"model {mid}: {entry.error}")
        return entry

    def content_hash(self, entry: ModelEntry) -> str:
        """blake2b-128 of the entry's weights, the reference encoder and word map included
        (cached per file by size and mtime)."""
        cached = self._hash_cache.get(entry.load_key)
        if cached is None:
            _index, files = check_folder(entry.path)
            # the r2v parts outside model_index.json change the pixels too
            if entry.reference_encoder:
                files = files + sorted((entry.path / entry.reference_encoder).glob(
                    "*.safetensors"))
            if entry.reference_words:
                files = files + [entry.path / entry.reference_words["map"]]
            files = sorted(set(files))
            if entry.denoiser_file is not None:  # the folder's other parts + the file
                replaced = entry.path / entry.denoiser_subfolder
                files = [f for f in files if replaced not in f.parents]
                both = weights_hash(entry.path, files) + weights_hash(
                    entry.denoiser_file.parent, [entry.denoiser_file])
                cached = hashlib.blake2b(both.encode(), digest_size=16).hexdigest()
            else:
                cached = weights_hash(entry.path, files)
            self._hash_cache[entry.load_key] = cached
        return cached


_WHOLE_FIELDS = ("spatial_multiple", "frame_multiple", "min_size", "max_size", "max_pixels",
                 "max_frames", "max_steps", "default_width", "default_height",
                 "default_frames", "default_steps", "max_references")


def _capabilities_error(caps) -> str:
    """Why a model's capabilities (the family's, with its ``studio.json`` overrides) are
    unusable, naming the field; "" when they are usable. Checked when the model is listed:
    a bad value reached the settings panel, whose handler failed half-way and left it
    stuck for every model, and the CLI, as an internal error."""
    for name in _WHOLE_FIELDS:
        value = getattr(caps, name)
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{name}={value!r} must be a whole number"
        if value < (0 if name == "max_references" else 1):
            return f"{name}={value} must be at least {0 if name == 'max_references' else 1}"
    for name in ("default_fps", "default_guidance"):
        value = getattr(caps, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            return f"{name}={value!r} must be a number"
    rng = caps.guidance_range
    if not (isinstance(rng, tuple) and len(rng) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            for x in rng) and rng[0] <= rng[1]):
        return f"guidance_range={list(rng) if isinstance(rng, tuple) else rng!r} must be " \
               f"[low, high] with low <= high"
    if not caps.modes:
        return "modes: none of the modes given is one this model's family runs"
    if caps.min_size > caps.max_size:
        return f"min_size={caps.min_size} is above max_size={caps.max_size}"
    checks = (("default_width", caps.default_width, caps.min_size, caps.max_size),
              ("default_height", caps.default_height, caps.min_size, caps.max_size),
              ("default_steps", caps.default_steps, 1, caps.max_steps),
              ("default_frames", caps.default_frames, 1, max(caps.max_frames, 1)),
              ("default_guidance", caps.default_guidance, *rng))
    for name, value, lo, hi in checks:
        if not lo <= value <= hi:
            return f"{name}={value} must be in [{lo}, {hi}]"
    return ""


def _attention_tuning_error(value) -> str:
    """Why ``studio.json``'s ``attention`` (profile -> a ``STUDIO_ATTENTION``-format string,
    e.g. ``{"fast": "sage"}``) is unusable; "" when it is usable or absent."""
    from studio.engine.attention_config import ATTENTION_ENV, attention_override

    if value is None:
        return ""
    if not isinstance(value, dict):
        return f"must be an object of profile -> attention, not {type(value).__name__}"
    for profile, text in value.items():
        if profile not in ("quality", "balanced", "fast"):
            return f"{profile!r} is not quality, balanced or fast"
        if not isinstance(text, str) or not text.strip():
            return f"{profile}: {text!r} is not an attention setting such as \"sage\""
        try:
            attention_override(text)
        except ValueError as exc:
            return f"{profile}: {str(exc).removeprefix(ATTENTION_ENV + ': ')}"
    return ""


def _reference_words_error(folder: Path, value, reference_encoder: str) -> str:
    """Why ``studio.json``'s ``reference_words`` is unusable ("" when it is usable): the
    declaration's shape, the map file (inside the folder, a whole safetensors file) and the
    placeholder (one word of letters)."""
    if not isinstance(value, dict) or set(value) != {"map", "placeholder"}:
        return f"{value!r} must be {{\"map\": <file>, \"placeholder\": <word>}}"
    if not reference_encoder:
        return "needs reference_tokens (the pseudo-words are made from its tokens)"
    path, word = value["map"], value["placeholder"]
    if not isinstance(word, str) or not word.isalpha():
        return f"placeholder={word!r} must be one word of letters"
    if not isinstance(path, str) or not path.endswith(".safetensors"):
        return f"map={path!r} must name a .safetensors file"
    target = folder / path
    try:
        inside = target.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):
        inside = False
    if Path(path).is_absolute() or ".." in Path(path).parts or not inside:
        return f"map={path!r} is not inside the model folder"
    if not target.is_file():
        return f"map={path!r}: no such file in the model folder"
    try:
        check_safetensors(target)
    except ModelError as exc:
        return f"map={path!r}: {exc}"
    return ""
