"""Does the denoiser move the object the way the caption says? A diagnostic for the embedded
model's motion words.

Renders single-object clips moving left or right on solid backgrounds, noises their latents
to each noise level s (one fixed noise draw), and predicts x_0 = x_t - s v with the true
caption and with the caption whose motion is flipped (left <-> right). It reports the
horizontal shift of the object between the first and last latent frame of each prediction,
in latent pixels along the true motion (the object's centre: the centroid of each frame's
deviation from its spatial median, summed over channels). A denoiser that reads its motion
words predicts a positive shift with the true caption and a negative one with the flipped
caption at high noise, where x_t does not yet show the trajectory.

    .venv/bin/python scripts/probe_motion_words.py [--model assets/models/tiny-wan]
        [--clips 16] [--noise-levels 0.98,0.9,0.75,0.5]

On 2026-12-05, 16 clips (the truth: 3.55 latent pixels for the 2x-VAE export of step 5337,
0.40 for the shipped 4x-VAE model, whose latent frames hold 4 frames each):

    2x VAE, step 5337  s=0.98: +0.33 true / +0.36 flipped; 0.9: +1.13 / +1.15;
                       0.75: +2.24 / +2.24; 0.5: +2.84 / +2.84
    shipped (4x VAE)   s=0.98: -0.12 / -0.12; 0.9: +0.01 / +0.00; 0.75: +0.19 / +0.21

Neither denoiser's prediction depends on the motion word at any noise level: the shift comes
from x_t alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FLIP = {"left": "right", "right": "left"}
SOLID_BACKGROUNDS = 6  # the first six of world.BACKGROUNDS are solid colours


def horizontal_shift(z: torch.Tensor) -> torch.Tensor:
    """(B, C, f, h, w) latents -> (B,) the object's centroid column in the last latent frame
    minus the first, in latent pixels."""
    energy = (z - z.flatten(3).median(3).values[..., None, None]).abs().sum(1)  # (B, f, h, w)
    columns = torch.arange(z.shape[-1], dtype=z.dtype)
    mass = energy.sum(2)  # (B, f, w)
    centre = (mass * columns).sum(-1) / mass.sum(-1)
    return centre[:, -1] - centre[:, 0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(ROOT / "assets" / "models" / "tiny-wan"))
    parser.add_argument("--clips", type=int, default=16)
    parser.add_argument("--noise-levels", default="0.98,0.9,0.75,0.5")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--motion-distance", type=float, default=None,
                        help="render the clips with this travel (world.MOTION_DISTANCE; for "
                             "a denoiser trained with train dit --motion-distance)")
    args = parser.parse_args(argv)
    try:
        levels = [float(x) for x in args.noise_levels.split(",")]
    except ValueError:
        parser.error(f"--noise-levels: comma-separated numbers, got {args.noise_levels!r}")
    if not all(0 < s <= 1 for s in levels):
        parser.error(f"--noise-levels must each be in (0, 1], got {args.noise_levels}")
    if not 2 <= args.clips <= 256:
        parser.error(f"--clips must be in [2, 256], got {args.clips}")
    if args.motion_distance is not None and not 0 <= args.motion_distance <= 0.5:
        parser.error(f"--motion-distance must be in [0, 0.5], got {args.motion_distance}")
    torch.set_num_threads(args.threads)

    from studio.tiny import world
    from studio.tiny.autoencoder import CLIP_FRAMES, SIZE
    from studio.tiny.probe import DenoiserProbe

    if args.motion_distance is not None:
        world.MOTION_DISTANCE = args.motion_distance  # this process only
    try:
        probe = DenoiserProbe(args.model)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    transformer = probe.pipe.transformer
    rng = np.random.default_rng(0)
    specs = []
    while len(specs) < args.clips:
        spec = world.sample_scene(rng, video=True)
        if (len(spec.objects) == 1 and spec.objects[0].motion in FLIP
                and spec.background in world.BACKGROUNDS[:SOLID_BACKGROUNDS]):
            specs.append(spec)
    captions = [world.caption(s, rng) for s in specs]
    flipped = [world.caption(dataclasses.replace(s, objects=(dataclasses.replace(
        s.objects[0], motion=FLIP[s.objects[0].motion]),)), rng) for s in specs]
    x0 = probe.encode_pixels(np.stack([world.render_clip(s, CLIP_FRAMES, SIZE, SIZE, rng)
                                       for s in specs]))
    sign = torch.tensor([1.0 if s.objects[0].motion == "right" else -1.0 for s in specs])
    print(f"truth: {float((horizontal_shift(x0) * sign).mean()):+.2f} latent pixels")
    b, _, f, h, w = x0.shape
    patch = transformer.config.patch_size[1]
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(1))
    texts = {"true": probe.encode_text(captions), "flipped": probe.encode_text(flipped)}
    for s in levels:
        xt = (1 - s) * x0 + s * noise
        timestep = torch.full((b, f * (h // patch) * (w // patch)), s * 1000.0)
        shifts = {}
        for name, text in texts.items():
            with torch.no_grad():
                v = transformer(hidden_states=xt, timestep=timestep, encoder_hidden_states=text,
                                return_dict=False)[0]
            shifts[name] = float((horizontal_shift(xt - s * v) * sign).mean())
        print(f"s={s}: shift along the true motion {shifts['true']:+.2f} with the true caption, "
              f"{shifts['flipped']:+.2f} with the flipped one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
