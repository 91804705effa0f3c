"""Does the latent space hold the object's motion? A diagnostic for the embedded model.

Trains a small probe (3D convolutions over the 3 latent frames, a max-pool and a linear
layer) to read the motion class (left, right, up, down, growing, shrinking, still) from the
VAE encoder's latents of single-object world clips (9 frames, 64x64), and tests it on
held-out clips; beside it, the adherence evaluator reads the motion from the VAE's
*reconstructions* of the same test clips. A high probe score with a low reconstruction score
says the decoder, not the latent space, loses the motion; a low probe score says the
encoder's 4x temporal compression does.

    .venv/bin/python scripts/probe_motion_in_latents.py [--model assets/models/tiny-wan]
        [--train 1536] [--test 256] [--epochs 40] [--distance 0.18]

On 2026-12-01 (shipped VAE: encoder of the jointly trained VAE, 16-wide retrained decoder;
defaults, 1 thread, 6 min): the probe reads the motion from the encoder's latents 83.6 % of
the time (left 93 %, right 90 %, up 97 %, down 79 %, growing 85 %, shrinking 83 %, still
53 %), the evaluator from the reconstructions 61.3 %: the latents hold more motion than the
decoder gives back, as they did for shape.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(ROOT / "assets" / "models" / "tiny-wan"))
    ap.add_argument("--train", type=int, default=1536)
    ap.add_argument("--test", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--distance", type=float, default=None,
                    help="override world.MOTION_DISTANCE (fraction of the frame per clip)")
    args = ap.parse_args(argv)
    for name in ("train", "test", "epochs"):
        if getattr(args, name) < 1:
            ap.error(f"--{name}: must be at least 1")
    from diffusers import AutoencoderKLWan

    from studio.tiny import evaluate, world

    if args.distance is not None:
        if not 0 < args.distance < 1:
            ap.error("--distance: must be in (0, 1)")
        world.MOTION_DISTANCE = args.distance
    torch.manual_seed(0)
    vae = AutoencoderKLWan.from_pretrained(Path(args.model) / "vae").float().eval()
    motions = list(world.MOTIONS)

    def clips(rng, n, split):
        specs = []
        while len(specs) < n:
            spec = world.sample_scene(rng, video=True, split=split, two_object_prob=0.0)
            specs.append(spec)
        pixels = np.stack([world.render_clip(s, 9, 64, 64, rng) for s in specs])
        return specs, pixels

    @torch.no_grad()
    def encode(pixels, decode=False):
        zs, recs = [], []
        for i in range(0, len(pixels), 32):
            x = torch.from_numpy(pixels[i:i + 32]).float().permute(0, 4, 1, 2, 3) / 127.5 - 1
            z = vae.encode(x).latent_dist.mode()
            zs.append(z)
            if decode:
                y = vae.decode(z).sample.clamp(-1, 1)
                recs.append(((y + 1) * 127.5).round().byte().permute(0, 2, 3, 4, 1).numpy())
        return torch.cat(zs), (np.concatenate(recs) if decode else None)

    train_specs, train_px = clips(np.random.default_rng(1), args.train, "train")
    test_specs, test_px = clips(np.random.default_rng(2), args.test, "eval")
    z_train, _ = encode(train_px)
    z_test, recs = encode(test_px, decode=True)
    y_train = torch.tensor([motions.index(s.objects[0].motion) for s in train_specs])
    y_test = torch.tensor([motions.index(s.objects[0].motion) for s in test_specs])
    mean, std = z_train.mean((0, 2, 3, 4), keepdim=True), z_train.std((0, 2, 3, 4), keepdim=True)
    z_train, z_test = (z_train - mean) / std, (z_test - mean) / std
    c = z_train.shape[1]
    probe = nn.Sequential(
        nn.Conv3d(c, 32, 3, padding=1), nn.GELU(), nn.Conv3d(32, 32, 3, padding=1), nn.GELU(),
        nn.Conv3d(32, 32, (3, 3, 3), padding=(0, 1, 1)), nn.GELU(),  # mixes the 3 frames
        nn.AdaptiveMaxPool3d(1), nn.Flatten(), nn.Linear(32, len(motions)))
    opt = torch.optim.AdamW(probe.parameters(), lr=2e-3, weight_decay=1e-4)
    for _ in range(args.epochs):
        perm = torch.randperm(len(z_train))
        for i in range(0, len(perm), 64):
            idx = perm[i:i + 64]
            loss = nn.functional.cross_entropy(probe(z_train[idx]), y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        pred = probe(z_test).argmax(1)
    latent_acc = float((pred == y_test).float().mean())
    report = evaluate.evaluate(list(recs), test_specs)
    pixel_acc = report.accuracy.get("motion", float("nan"))
    print(f"motion distance {world.MOTION_DISTANCE}: probe on encoder latents "
          f"{latent_acc:.1%}, evaluator on VAE reconstructions {pixel_acc:.1%} "
          f"({args.test} held-out clips)")
    for k, name in enumerate(motions):
        mask = y_test == k
        if mask.any():
            print(f"  {name:10s} latents {float((pred[mask] == k).float().mean()):.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
