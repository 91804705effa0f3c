"""User images in (cases 001 and 002): damaged files refused, every pixel format converted."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from studio.core.media import (
    BACKGROUND_RGB,
    InputImageError,
    decode_user_image,
    fit_image,
    fit_size,
    load_user_image,
    pixels_content_id,
)
from tests.conftest import CASES

CASE1 = CASES / "001-truncated-init-image"
CASE2 = CASES / "002-init-image-modes"


def png_bytes(img: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", **kw)
    return buf.getvalue()


@pytest.mark.parametrize("field", ["init_image", "first_frame", "references[0]"])
def test_truncated_file_is_refused_naming_field_and_file(field):
    with pytest.raises(InputImageError) as info:
        load_user_image(CASE1 / "truncated.png", field)
    msg = str(info.value)
    assert msg.startswith(field) and "truncated.png" in msg and "damaged or incomplete" in msg
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("cut", [0.1, 0.5, 0.9])
def test_any_truncation_of_any_format_is_refused(cut):
    img = Image.fromarray((np.random.default_rng(0).random((40, 56, 3)) * 255).astype(np.uint8))
    for fmt in ("PNG", "JPEG", "WEBP", "GIF", "BMP"):
        buf = io.BytesIO()
        img.save(buf, format=fmt)
        data = buf.getvalue()
        with pytest.raises(InputImageError, match="damaged or incomplete"):
            decode_user_image(data[: int(len(data) * cut)], f"x.{fmt.lower()}", "init_image")


def test_not_an_image_and_missing_file():
    with pytest.raises(InputImageError, match="damaged or incomplete"):
        decode_user_image(b"hello world", "notes.txt", "init_image")
    with pytest.raises(InputImageError, match="does not exist"):
        load_user_image(CASE1 / "nope.png", "init_image")


def test_rgba_transparent_is_composited_on_white_not_black():
    img = load_user_image(CASE2 / "rgba_transparent.png")
    src = np.asarray(Image.open(CASE2 / "rgba_transparent.png"))
    clear = src[..., 3] == 0
    assert clear.any() and (img.pixels[clear] == BACKGROUND_RGB).all()
    opaque = src[..., 3] == 255
    assert (img.pixels[opaque] == src[opaque][:, :3]).all()
    assert "white" in img.conversion and img.pixels.dtype == np.uint8


def test_fully_transparent_image_is_said_to_be_plain_white():
    rgba = np.zeros((4, 6, 4), np.uint8)
    rgba[..., 2] = 255  # blue, but nowhere visible
    img = decode_user_image(png_bytes(Image.fromarray(rgba, "RGBA")), "clear.png")
    assert (img.pixels == 255).all()
    assert img.conversion == "fully transparent: every pixel became white #FFFFFF"
    rgba[0, 0, 3] = 1  # one pixel barely there: composited, not "fully transparent"
    img = decode_user_image(png_bytes(Image.fromarray(rgba, "RGBA")), "almost.png")
    assert img.conversion == "transparency composited on white #FFFFFF"


def test_partial_alpha_is_blended():
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[..., 0] = 255
    rgba[..., 3] = 128
    img = decode_user_image(png_bytes(Image.fromarray(rgba, "RGBA")), "half.png")
    assert tuple(img.pixels[0, 0]) == (255, 127, 127)


def test_gray16_is_scaled_not_clipped():
    src = np.asarray(Image.open(CASE2 / "gray16.png"), dtype=np.float64)
    img = load_user_image(CASE2 / "gray16.png")
    expect = np.rint(src * 255 / 65535).astype(np.uint8)
    assert (img.pixels[..., 0] == expect).all() and (img.pixels[..., 2] == expect).all()
    assert len(np.unique(img.pixels)) > 16  # a gradient, not all-white
    assert "16-bit" in img.conversion


def test_gray16_made_here_spans_full_range():
    ramp = np.linspace(0, 65535, 64).astype(np.uint16).reshape(8, 8)
    img = decode_user_image(png_bytes(Image.fromarray(ramp)), "ramp.png")
    assert img.pixels.min() == 0 and img.pixels.max() == 255


def test_palette_is_expanded():
    src = Image.open(CASE2 / "palette.png")
    img = load_user_image(CASE2 / "palette.png")
    assert (img.pixels == np.asarray(src.convert("RGB"))).all()
    assert "palette" in img.conversion


def test_gray_alpha_odd_size():
    img = load_user_image(CASE2 / "gray_alpha.png")
    assert img.pixels.shape == (72, 40, 3) and img.size == (40, 72)
    assert "white" in img.conversion


def test_mask_is_binary():
    m = load_user_image(CASE2 / "rgba_transparent.png", "mask", mask=True)
    assert m.pixels.ndim == 2 and set(np.unique(m.pixels)) <= {0, 255}


def test_a_mask_that_repaints_nothing_is_refused():
    black = png_bytes(Image.new("L", (32, 32), 127))  # just under the threshold
    with pytest.raises(InputImageError, match=r"mask: black.png has no pixel at or above "
                                              r"grey 128 .* would repaint nothing"):
        decode_user_image(black, "black.png", "mask", mask=True)
    one = Image.new("L", (32, 32), 0)
    one.putpixel((5, 7), 200)
    m = decode_user_image(png_bytes(one), "one.png", "mask", mask=True)
    assert m.pixels.sum() == 255 and m.pixels[7, 5] == 255


def test_content_id_is_of_pixels():
    a = load_user_image(CASE2 / "palette.png")
    same = decode_user_image(png_bytes(Image.fromarray(a.pixels)), "copy.png")
    assert a.content_id == same.content_id == pixels_content_id(a.pixels)
    other = a.pixels.copy()
    other[0, 0, 0] ^= 1
    assert pixels_content_id(other) != a.content_id


@pytest.mark.parametrize("size,multiple,max_pixels,expect", [
    ((40, 72), 16, 65536, (48, 80)),     # ties round up, aspect kept within a multiple
    ((64, 64), 16, 65536, (64, 64)),
    ((1000, 500), 16, 65536, (368, 176)),  # scaled down into the pixel budget
    ((5, 5), 16, 65536, (16, 16)),
    ((1920, 1080), 32, 1280 * 720, (1280, 704)),
])
def test_fit_size(size, multiple, max_pixels, expect):
    w, h = fit_size(size, multiple, max_pixels)
    assert (w, h) == expect
    assert w % multiple == 0 and h % multiple == 0 and w * h <= max_pixels


def test_fit_image_covers_and_crops_without_stretching():
    img = load_user_image(CASE2 / "gray_alpha.png").pixels
    out = fit_image(img, 48, 80)
    assert out.shape == (80, 48, 3) and out.dtype == np.uint8
    wide = np.zeros((10, 40, 3), np.uint8)
    wide[:, 18:22] = 255  # a centred vertical bar stays centred and vertical
    out = fit_image(wide, 16, 16)
    assert out.shape == (16, 16, 3)
    assert out[:, 7:9].mean() > 200 and out[:, :4].mean() < 10


def test_special_files_and_huge_files_are_refused_before_reading(tmp_path, monkeypatch):
    """A device, a folder or a pipe is not read (``/dev/zero`` once ate all memory); a file
    over the cap is refused by its size."""
    import os

    import studio.core.media as media

    for path in ("/dev/zero", str(tmp_path)):
        with pytest.raises(InputImageError, match="init_image: .* is not a regular file"):
            load_user_image(path, "init_image")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(InputImageError, match="is not a regular file"):
        load_user_image(fifo, "init_image")  # would block forever if it were opened
    big = tmp_path / "big.png"
    big.write_bytes(b"\0" * 2048)
    monkeypatch.setattr(media, "MAX_IMAGE_FILE_BYTES", 1024)
    with pytest.raises(InputImageError, match="image files up to 0 MiB are read"):
        load_user_image(big, "mask")


def test_a_file_name_that_is_not_utf8_is_recorded_readable():
    from studio.core.media import readable_name

    assert readable_name("café.png") == "café.png"
    assert readable_name("caf\udce9.png") == "caf\ufffd.png"  # byte 0xE9 of a Latin-1 name
    assert readable_name("a\ud800b").encode("utf-8")  # any lone surrogate: encodable after
