"""What a model can do: the rules a request is validated against."""

from __future__ import annotations

from dataclasses import dataclass, field

MODES = ("t2i", "i2i", "t2v", "i2v", "r2v")
VIDEO_MODES = frozenset({"t2v", "i2v", "r2v"})
MODE_NAMES = {
    "t2i": "text to image",
    "i2i": "image to image",
    "t2v": "text to video",
    "i2v": "image to video",
    "r2v": "reference to video",
}


@dataclass(frozen=True)
class ModelCapabilities:
    """The modes and the size, frame and guidance rules of one model.

    Attributes:
        name: the model's display name (used in messages).
        family: e.g. ``wan``, ``flux``.
        modes: the supported modes (subset of :data:`MODES`).
        spatial_multiple: width and height must be multiples of this (pixels); for latent
            DiTs it is the VAE's spatial factor times the patch size.
        frame_multiple: video frame counts must be ``frame_multiple * k + 1`` (the VAE's
            temporal factor: 4 for Wan, 8 for LTX); 1 allows any count.
        min_size / max_size: bounds on each side (pixels).
        max_pixels: bound on width x height.
        max_frames: bound on video frames.
        default_*: what the UI and CLI fill in when the user gives nothing.
        guidance_range: allowed classifier-free guidance scale.
        supports_mask: image-to-image takes an inpainting mask.
        max_references: reference images accepted in ``r2v``.
    """

    name: str
    family: str
    modes: frozenset[str]
    spatial_multiple: int = 16
    frame_multiple: int = 1
    min_size: int = 16
    max_size: int = 2048
    max_pixels: int = 2048 * 2048
    max_frames: int = 1
    max_steps: int = 200
    default_width: int = 512
    default_height: int = 512
    default_frames: int = 1
    default_fps: float = 16.0
    default_steps: int = 20
    default_guidance: float = 5.0
    guidance_range: tuple[float, float] = (0.0, 30.0)
    supports_mask: bool = False
    max_references: int = 0
    notes: tuple[str, ...] = field(default=())

    @property
    def min_video_frames(self) -> int:
        return self.frame_multiple + 1 if self.frame_multiple > 1 else 2

    def nearest_frames(self, frames: int) -> int:
        """The valid frame count nearest to ``frames`` (ties round up), within bounds."""
        k = self.frame_multiple
        if k <= 1:
            return max(2, min(frames, self.max_frames))
        n = max(1, round((frames - 1) / k + 1e-9))
        return min(n * k + 1, (self.max_frames - 1) // k * k + 1)
