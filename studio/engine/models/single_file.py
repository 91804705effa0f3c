"""Single-file denoiser checkpoints: one ``.safetensors`` file in a model folder (a fine-tuned
FLUX, Wan, SD3, LTX, Qwen-Image or HiDream transformer, or an SD/SDXL UNet, in its original
layout as ComfyUI and the model authors ship it), run on top of a diffusers folder of the
same model that supplies the text encoders, the VAE, the scheduler and the configs.

A file is checked without loading a weight: its safetensors header gives every tensor's name
and shape; diffusers' own key conversion for each candidate denoiser class
(``SINGLE_FILE_LOADABLE_CLASSES``, run on meta tensors) maps them to the diffusers layout,
and the file is paired with the first usable diffusers folder whose denoiser has exactly
those names and shapes. Nothing is downloaded: the configs come from that folder. Loading is
diffusers' ``from_single_file(..., config=<that folder>)``.
"""

from __future__ import annotations

import json
from pathlib import Path

from studio.engine.models.folders import ModelError

DENOISERS = ("transformer", "unet")


def read_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Tensor name -> (safetensors dtype, shape), read from the file's header only.

    Raises:
        ModelError: not a readable safetensors file.
    """
    try:
        with open(path, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            if not 0 < size < 100 * 2**20:
                raise ValueError(f"header size {size}")
            header = json.loads(fh.read(size))
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: not a readable safetensors file ({exc})") from None
    return {name: (meta["dtype"], tuple(meta["shape"])) for name, meta in header.items()
            if name != "__metadata__"}


def _folder_denoiser(folder: Path) -> tuple[str, str, dict[str, tuple[int, ...]]] | None:
    """(subfolder, class name, diffusers tensor name -> shape) of a diffusers folder's
    denoiser, from its config and safetensors headers; None without one."""
    for sub in DENOISERS:
        config = folder / sub / "config.json"
        if not config.exists():
            continue
        cls = json.loads(config.read_text()).get("_class_name", "")
        shapes = {}
        for file in sorted((folder / sub).glob("*.safetensors")):
            shapes.update({k: v[1] for k, v in read_header(file).items()})
        return sub, cls, shapes
    return None


def converted_shapes(class_name: str, header: dict[str, tuple[str, tuple[int, ...]]],
                     config: dict | None = None) -> dict[str, tuple[int, ...]] | None:
    """The file's tensors renamed (and split or fused) into ``class_name``'s diffusers layout
    by diffusers' own conversion, on meta tensors; None when diffusers cannot convert it."""
    import torch
    from diffusers.loaders.single_file_model import SINGLE_FILE_LOADABLE_CLASSES

    mapping = SINGLE_FILE_LOADABLE_CLASSES.get(class_name, {}).get("checkpoint_mapping_fn")
    if mapping is None:
        return None
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    checkpoint = {name: torch.empty(shape, dtype=dtypes.get(dtype, torch.float32),
                                    device="meta") for name, (dtype, shape) in header.items()}
    try:
        converted = mapping(checkpoint=checkpoint, config=config or {})
    except Exception:  # diffusers raises many kinds on a layout it does not know
        return None
    return {k: tuple(v.shape) for k, v in converted.items()}


def find_base(path: Path, bases: list) -> tuple[object, str, str] | None:
    """The first usable diffusers entry whose denoiser the file ``path`` fits exactly:
    (entry, denoiser subfolder, denoiser class), or None."""
    header = read_header(path)
    for base in bases:
        if base.error or not base.path.is_dir():
            continue
        found = _folder_denoiser(base.path)
        if found is None:
            continue
        sub, cls, shapes = found
        config = json.loads((base.path / sub / "config.json").read_text())
        if converted_shapes(cls, header, config) == shapes:
            return base, sub, cls
    return None


def load_denoiser(file: Path, base_folder: Path, subfolder: str, class_name: str, dtype):
    """The denoiser from the single file, configured by the base folder (never the network).

    Raises:
        ModelError: diffusers could not load it (names the file and the reason).
    """
    import diffusers

    cls = getattr(diffusers, class_name)
    try:
        return cls.from_single_file(str(file), config=str(base_folder), subfolder=subfolder,
                                    torch_dtype=dtype, local_files_only=True)
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as exc:
        raise ModelError(f"{file}: cannot load as a {class_name} ({type(exc).__name__}: "
                         f"{str(exc)[:300]})") from exc
