"""User images in: the one documented conversion path to 8-bit RGB, and size fitting.

Conversion rules (every input image: init image, mask, first frame, reference):

* The file is decoded fully before anything else happens; a damaged or incomplete file raises
  :class:`InputImageError` naming the file ("damaged or incomplete").
* EXIF orientation is applied.
* Alpha (RGBA, LA, palette with transparency) is composited onto :data:`BACKGROUND_RGB`
  (white) — transparent areas become white, never black (a fully transparent image becomes
  plain white, and its conversion note says so).
* 16-bit and 32-bit integer data are scaled to 8 bits (``round(v * 255 / 65535)``), never
  clipped; float images are scaled from [0, 1].
* Palette images are expanded; grayscale is replicated to three channels; CMYK/YCbCr/LAB go
  through Pillow's RGB conversion.
* Masks are converted to one channel: white (>= 128) = repaint, black = keep.

The content id of an input is blake2b-128 of its converted pixels and shape
(:func:`pixels_content_id`), so the same picture saved as PNG or as JPEG-lossless has the same
id, and a request names its inputs by those ids.

Size rule (:func:`fit_size`): when the user gives no size, the output takes the image's size,
scaled down to the model's pixel budget if larger, and each side rounded to the nearest
multiple of the model's spatial factor (ties round up, at least one multiple). The image is
then resized to cover that size (aspect ratio kept, Lanczos) and centre-cropped
(:func:`fit_image`), so at most a sliver of one axis is cropped and nothing is stretched.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

BACKGROUND_RGB = (255, 255, 255)
MAX_INPUT_PIXELS = 64_000_000


class InputImageError(ValueError):
    """An input image cannot be used; the message names the field and the file."""


@dataclass(frozen=True)
class UserImage:
    """An input image converted to 8-bit RGB.

    Attributes:
        pixels: uint8 array (H, W, 3), or (H, W) for masks.
        content_id: :func:`pixels_content_id` of ``pixels``.
        source: the file name given.
        conversion: human-readable record of what the conversion did.
    """

    pixels: np.ndarray
    content_id: str
    source: str
    conversion: str

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) in pixels."""
        return int(self.pixels.shape[1]), int(self.pixels.shape[0])


def pixels_content_id(pixels: np.ndarray) -> str:
    """blake2b-128 hex of a uint8 array's shape and bytes (C order)."""
    arr = np.ascontiguousarray(pixels, dtype=np.uint8)
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(tuple(arr.shape)).encode())
    h.update(arr.tobytes())
    return h.hexdigest()


def _open_fully(data: bytes, name: str, field: str) -> Image.Image:
    import warnings

    try:
        with warnings.catch_warnings():
            # Pillow warns (then raises) on huge images; the size check below explains it
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            if img.width * img.height > MAX_INPUT_PIXELS:
                raise InputImageError(f"{field}: {name} is {img.width}x{img.height}; at most "
                                      f"{MAX_INPUT_PIXELS} pixels are accepted")
            img.load()
    except InputImageError:
        raise
    except Image.DecompressionBombError as exc:  # Pillow's own limit, above ours: same words
        import re

        found = re.search(r"\((\d+) pixels\)", str(exc))
        size = f" ({int(found.group(1))} pixels)" if found else ""
        raise InputImageError(f"{field}: {name} is too large{size}; at most "
                              f"{MAX_INPUT_PIXELS} pixels are accepted") from None
    except UnidentifiedImageError:
        raise InputImageError(
            f"{field}: {name} is not an image this studio reads, or is damaged or incomplete "
            f"(PNG, JPEG, WebP, GIF, BMP and TIFF are read)") from None
    except (OSError, SyntaxError, ValueError) as exc:
        detail = str(exc) or type(exc).__name__
        raise InputImageError(
            f"{field}: the image file {name} is damaged or incomplete ({detail})") from None
    return img


def _to_rgb8(img: Image.Image, notes: list[str]) -> np.ndarray:
    mode = img.mode
    if mode == "P":
        has_alpha = "transparency" in img.info or img.palette.mode == "RGBA"
        img = img.convert("RGBA" if has_alpha else "RGB")
        notes.append("palette expanded")
        mode = img.mode
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        arr = np.asarray(img, dtype=np.float64)
        top = 65535.0 if mode.startswith("I;16") or arr.max(initial=0) <= 65535 else 2**32 - 1
        notes.append(f"{16 if top == 65535 else 32}-bit grayscale scaled to 8-bit")
        gray = np.clip(np.rint(arr * 255.0 / top), 0, 255).astype(np.uint8)
        return np.repeat(gray[..., None], 3, axis=2)
    if mode == "F":
        arr = np.asarray(img, dtype=np.float64)
        notes.append("float image scaled from [0, 1] to 8-bit")
        gray = np.clip(np.rint(arr * 255.0), 0, 255).astype(np.uint8)
        return np.repeat(gray[..., None], 3, axis=2)
    if mode in ("RGBA", "LA", "PA", "RGBa", "La") or (mode in ("RGB", "L") and
                                                       "transparency" in img.info):
        rgba = img.convert("RGBA")
        alpha = np.asarray(rgba, dtype=np.float64)[..., 3:4] / 255.0
        rgb = np.asarray(rgba, dtype=np.float64)[..., :3]
        bg = np.asarray(BACKGROUND_RGB, dtype=np.float64)
        white = "white #" + "".join(f"{c:02X}" for c in BACKGROUND_RGB)
        if alpha.max() == 0.0:  # nothing of the picture is left: say so plainly
            notes.append(f"fully transparent: every pixel became {white}")
        elif alpha.min() < 1.0:
            notes.append(f"transparency composited on {white}")
        return np.clip(np.rint(rgb * alpha + bg * (1 - alpha)), 0, 255).astype(np.uint8)
    if mode == "1":
        notes.append("1-bit expanded")
    elif mode == "L":
        notes.append("grayscale replicated to RGB")
    elif mode != "RGB":
        notes.append(f"{mode} converted to RGB")
    return np.asarray(img.convert("RGB"), dtype=np.uint8).copy()


MAX_IMAGE_FILE_BYTES = 256 * 2**20  # an input image file is read whole: cap it


def load_user_image(path: str | os.PathLike[str], field: str = "image", *,
                    mask: bool = False) -> UserImage:
    """Reads an image file and converts it by the module's documented rules.

    Args:
        path: the file.
        field: the request field it is for (named in errors), e.g. ``init_image``.
        mask: convert to a one-channel mask (uint8 (H, W), 255 = repaint, 0 = keep).

    Raises:
        InputImageError: missing, not a regular file, over ``MAX_IMAGE_FILE_BYTES``,
            unreadable, damaged, incomplete or too large.
    """
    name = os.fspath(path)
    try:
        info = os.stat(name)
        if not stat.S_ISREG(info.st_mode):
            raise InputImageError(f"{field}: {name} is not a regular file (a folder, device "
                                  f"or pipe); give an image file")
        if info.st_size > MAX_IMAGE_FILE_BYTES:
            raise InputImageError(f"{field}: {name} is {info.st_size / 2**20:.0f} MiB; image "
                                  f"files up to {MAX_IMAGE_FILE_BYTES // 2**20} MiB are read")
        with open(name, "rb") as fh:
            data = fh.read(MAX_IMAGE_FILE_BYTES + 1)
    except FileNotFoundError:
        raise InputImageError(f"{field}: the file {name} does not exist") from None
    except OSError as exc:
        raise InputImageError(f"{field}: cannot read {name} ({exc.strerror})") from None
    return decode_user_image(data, readable_name(os.path.basename(name)), field, mask=mask)


def readable_name(name: str) -> str:
    """``name`` as valid Unicode: the bytes of a file name that is not UTF-8 (carried by
    Python as lone surrogates, ``surrogateescape``) become U+FFFD, so the name can be
    recorded in a result's metadata and JSON ("caf\\udce9.png" -> "caf\ufffd.png")."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        try:
            raw = name.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raw = name.encode("utf-8", "surrogatepass")
        return raw.decode("utf-8", "replace")


def decode_user_image(data: bytes, name: str, field: str = "image", *,
                      mask: bool = False) -> UserImage:
    """As :func:`load_user_image`, from the file's bytes (e.g. a drop or a paste)."""
    img = _open_fully(data, name, field)
    notes: list[str] = []
    frames = getattr(img, "n_frames", 1)
    if frames > 1:
        notes.append(f"first of {frames} frames used")
    try:
        transposed = ImageOps.exif_transpose(img)
    except Exception:  # a broken EXIF block must not refuse an otherwise good image
        transposed = None
    if transposed is not None and transposed is not img:
        if transposed.size != img.size or transposed.tobytes() != img.tobytes():
            notes.append("EXIF orientation applied")
        img = transposed
    rgb = _to_rgb8(img, notes)
    if mask:
        gray = rgb.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
        pixels = np.where(gray >= 128, 255, 0).astype(np.uint8)
        if not pixels.any():
            raise InputImageError(
                f"{field}: {name} has no pixel at or above grey 128 (white = repaint), so it "
                f"would repaint nothing; paint the area to change white, or leave the mask "
                f"out to change the whole image")
        notes.append("mask thresholded at 128 (white = repaint)")
    else:
        pixels = rgb
    conversion = "; ".join(notes) if notes else "8-bit RGB as is"
    return UserImage(pixels, pixels_content_id(pixels), name, conversion)


def _nearest_multiple(value: float, multiple: int) -> int:
    return max(multiple, int(value / multiple + 0.5) * multiple)


def fit_size(image_size: tuple[int, int], multiple: int, max_pixels: int,
             min_size: int = 0, max_size: int = 1 << 30) -> tuple[int, int]:
    """The valid (width, height) for an image of ``image_size`` (pixels) by the module's rule.

    Scales down to ``max_pixels`` (and ``max_size`` per side) keeping the aspect ratio, then
    rounds each side to the nearest multiple (ties up), within [min_size, max_size].
    """
    w, h = image_size
    if w <= 0 or h <= 0:
        raise ValueError(f"image size: {w}x{h} is empty")
    scale = min(1.0, (max_pixels / (w * h)) ** 0.5, max_size / w, max_size / h)
    if min(w, h) * scale < min_size:
        scale = min(min_size / min(w, h), max_size / max(w, h))
    lo = -(-min_size // multiple) * multiple if min_size else multiple
    hi = max_size // multiple * multiple
    out_w = min(max(_nearest_multiple(w * scale, multiple), lo), hi)
    out_h = min(max(_nearest_multiple(h * scale, multiple), lo), hi)
    aspect = w / h
    while out_w * out_h > max_pixels and max(out_w, out_h) > multiple:
        # shrink whichever side keeps the aspect ratio closest to the image's
        options = [(out_w - multiple, out_h), (out_w, out_h - multiple)]
        options = [o for o in options if min(o) >= multiple]
        out_w, out_h = min(options, key=lambda o: abs(o[0] / o[1] - aspect))
    return out_w, out_h


def fit_image(pixels: np.ndarray, width: int, height: int) -> np.ndarray:
    """Resizes to cover (width, height) keeping the aspect ratio, then centre-crops.

    Args:
        pixels: uint8 (H, W, 3) or (H, W).
    Returns:
        uint8 (height, width, 3) or (height, width); the input itself when already that size.
    """
    h, w = pixels.shape[:2]
    if (w, h) == (width, height):
        return pixels
    scale = max(width / w, height / h)
    new_w, new_h = max(width, round(w * scale)), max(height, round(h * scale))
    img = Image.fromarray(pixels)
    resample = Image.Resampling.NEAREST if pixels.ndim == 2 else Image.Resampling.LANCZOS
    img = img.resize((new_w, new_h), resample)
    left, top = (new_w - width) // 2, (new_h - height) // 2
    return np.asarray(img.crop((left, top, left + width, top + height))).copy()
