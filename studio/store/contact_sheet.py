"""Contact sheets: a labelled PNG grid of results, with every request embedded.

No Qt, no torch. Each cell shows one result (a video's first frame), scaled to fit a square
cell, with its label lines underneath. The PNG carries a ``studio:contact_sheet`` text chunk:
a JSON list of the cells' labels and requests, so every picture on the sheet can be reproduced.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont, PngImagePlugin

from studio.paths import atomic_write

BACKGROUND = (24, 24, 24)
TEXT = (230, 230, 230)
LINE_HEIGHT = 14
PADDING = 8


@dataclass(frozen=True)
class SheetItem:
    """One cell: ``pixels`` uint8 (H, W, 3), label lines, and the request (JSON-able)."""

    pixels: np.ndarray
    lines: tuple[str, ...] = ()
    request: dict[str, Any] = field(default_factory=dict)


def key_frame_strip(frames: np.ndarray) -> np.ndarray:
    """A clip's first, middle and last frames side by side, for a sheet cell: uint8
    (F, H, W, 3) -> (H, 3 W, 3); a single frame (F = 1) is returned as (H, W, 3)."""
    picks = sorted({0, len(frames) // 2, len(frames) - 1})
    return np.concatenate([frames[i] for i in picks], axis=1)


def make_contact_sheet(items: Sequence[SheetItem], cell: int = 256) -> np.ndarray:
    """The sheet as uint8 (H, W, 3): ``ceil(sqrt(n))`` columns of ``cell``-pixel squares.

    Raises:
        ValueError: no items, or a cell smaller than 32 pixels.
    """
    if not items:
        raise ValueError("items: select at least one result for a contact sheet")
    if cell < 32:
        raise ValueError(f"cell: expected at least 32 pixels, got {cell}")
    cols = math.ceil(math.sqrt(len(items)))
    rows = math.ceil(len(items) / cols)
    n_lines = max(len(item.lines) for item in items)
    cell_h = cell + n_lines * LINE_HEIGHT + PADDING
    sheet = Image.new("RGB", (cols * (cell + PADDING) + PADDING, rows * cell_h + PADDING),
                      BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    for i, item in enumerate(items):
        x0 = PADDING + (i % cols) * (cell + PADDING)
        y0 = PADDING + (i // cols) * cell_h
        image = Image.fromarray(np.ascontiguousarray(item.pixels[..., :3]))
        scale = min(cell / image.width, cell / image.height)
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        resample = Image.Resampling.NEAREST if scale >= 2 else Image.Resampling.LANCZOS
        image = image.resize(size, resample)
        sheet.paste(image, (x0 + (cell - size[0]) // 2, y0 + (cell - size[1]) // 2))
        for j, line in enumerate(item.lines):
            text = line if len(line) <= 48 else line[:47] + "…"
            draw.text((x0, y0 + cell + 2 + j * LINE_HEIGHT), text, fill=TEXT, font=font)
    return np.asarray(sheet)


def write_contact_sheet(path: str | Path, items: Sequence[SheetItem], cell: int = 256) -> Path:
    """Writes :func:`make_contact_sheet` to a PNG at ``path`` atomically, requests embedded."""
    if Path(path).suffix.lower() != ".png":
        raise ValueError(f"out={str(path)!r}: a contact sheet is a .png file")
    pixels = make_contact_sheet(items, cell)
    info = PngImagePlugin.PngInfo()
    info.add_itxt(
        "studio:contact_sheet",
        json.dumps([{"label": list(i.lines), "request": i.request} for i in items],
                   sort_keys=True),
    )
    return atomic_write(path, lambda tmp: Image.fromarray(pixels).save(tmp, "PNG", pnginfo=info))
