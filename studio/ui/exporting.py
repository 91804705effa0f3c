"""Exports of variants: one result to PNG/MP4/GIF/WebP, contact sheets, copy settings.

Files carry the full request (:func:`studio.store.export.write_result` embeds it, with the
engine environment recorded when the result was made), so every export can be re-run. The
pixels are read and encoded on a worker thread.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from studio.core.document import Document, Status
from studio.store.contact_sheet import SheetItem, write_contact_sheet
from studio.store.export import check_output_path, check_suffix, write_result
from studio.ui.background import Background
from studio.ui.controller import describe
from studio.ui.media_cache import MediaCache
from studio.ui.variants import variant_label

#: how the studio's messages name the file of an export (the CLI's say ``out='x.png'``)
EXPORT_LABEL = "export file"


class ExportError(Exception):
    """An export cannot be made; the message says why in plain words."""


def _done(document: Document, variant_id: str):
    v = document.variant(variant_id)
    if v.status != Status.DONE or not v.artifacts:
        raise ExportError(f"{variant_label(v)} has no result to export ({v.status}).")
    return v


def _engine_request(meta: dict, request_json: str) -> str:
    """The engine's copy of the request (with the weights' hash) when it is the same request
    otherwise; else the variant's own."""
    engine_json = meta.get("request_json")
    if not isinstance(engine_json, str):
        return request_json
    try:
        mine, theirs = json.loads(request_json), json.loads(engine_json)
    except ValueError:
        return request_json
    if not mine.get("model_hash"):
        mine["model_hash"] = theirs.get("model_hash", "")
    return engine_json if mine == theirs else request_json


def default_suffix(document: Document, variant_id: str) -> str:
    """".png" for an image result, ".mp4" for a video."""
    v = document.variant(variant_id)
    return ".mp4" if v.artifacts and v.artifacts[0].kind == "video" else ".png"


async def export_variant(document: Document, media: MediaCache, background: Background,
                         variant_id: str, path: str | Path) -> Path:
    """Writes a variant's result to ``path`` (.png, .mp4, .gif or .webp) with its request.

    Raises:
        ExportError: no result, a suffix that does not fit, or the file cannot be written.
    """
    v = _done(document, variant_id)
    art = v.artifacts[0]
    try:
        check_output_path(path, label=EXPORT_LABEL)
        frames = await media.load_frames(art.media_id)
        check_suffix(path, len(frames), label=EXPORT_LABEL)
    except (KeyError, OSError, ValueError) as exc:
        raise ExportError(str(exc)) from None
    meta = media.info(art.media_id)["meta"]
    fps = float(meta.get("fps") or v.request.get("fps") or 16.0)
    environment = meta.get("environment") or {}
    request_json = _engine_request(meta, v.request_json)
    try:
        return await background.call(write_result, path, frames, fps, request_json,
                                     environment, slow=True)
    except (OSError, ValueError) as exc:
        raise ExportError(_write_failure(path, exc)) from None


async def export_contact_sheet(document: Document, media: MediaCache, background: Background,
                               variant_ids: Sequence[str], path: str | Path,
                               cell: int = 256) -> Path:
    """Writes a labelled PNG grid of the variants' results (a video's first frame).

    Raises:
        ExportError: none of the variants has a result, or the file cannot be written.
    """
    # the variants as they are now (one deleted during a read below is still on the sheet)
    variants = [document.variant(vid) for vid in variant_ids if document.has_variant(vid)]
    items = []
    for v in variants:
        if v.status != Status.DONE or not v.artifacts:
            continue
        try:
            frames = await media.load_frames(v.artifacts[0].media_id)
        except (KeyError, OSError, ValueError) as exc:
            raise ExportError(f"cannot read the result of {variant_label(v)}: {exc}") from None
        request = v.request
        lines = (variant_label(v), describe(request),
                 f"steps {request.get('steps')} · cfg {request.get('guidance_scale')}")
        items.append(SheetItem(frames[0], lines, request))
    if not items:
        raise ExportError("None of the selected variants has a result yet.")
    try:
        check_output_path(path, label=EXPORT_LABEL)
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    try:
        return await background.call(write_contact_sheet, path, items, cell, slow=True)
    except (OSError, ValueError) as exc:
        raise ExportError(_write_failure(path, exc)) from None


def _write_failure(path: str | Path, exc: BaseException) -> str:
    """One line for a write that failed: the path once, and the system's reason."""
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return f"could not write {path}: {reason}"


def settings_text(document: Document, variant_id: str) -> str:
    """A variant's request as indented JSON (what "Copy settings" puts on the clipboard)."""
    return json.dumps(json.loads(document.variant(variant_id).request_json), indent=2,
                      sort_keys=True)
