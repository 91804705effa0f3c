"""Renders the README's samples of the embedded model through the CLI (the product path).

    .venv/bin/python scripts/make_readme_samples.py        # -> docs/images/samples/

Writes, for the shipped weights and fixed seeds:

* ``t2i.png``: six text-to-image results (64×64 each, shown 2× with nearest-neighbour
  scaling) side by side, their prompts in ``t2i.txt``;
* ``t2v.gif``: a text-to-video clip (9 frames, 64×64, 8 fps);
* ``i2v.gif``: an image-to-video clip whose first frame is the first text-to-image result;
* ``r2v.gif``: a reference-to-video clip: a reference image of an object, then the clip the
  prompt describes with that object.

Each file is rendered by ``studio render`` with its request embedded, so
``studio render --from docs/images/samples/t2v.gif`` reproduces it (given the same inputs).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "images" / "samples"
T2I = (
    "a small red star in the top left corner on a grass background",
    "a large blue circle in the middle against a white background",
    "a yellow triangle at the bottom right over a night sky",
    "a big green square on the left on a pink background",
    "a purple circle and an orange square on a brick wall",
    "a large white star at the top of the frame on a teal background",
)
T2V = "a blue circle slides to the right across a night sky"
I2V = "a small red star in the top left corner moves down on a grass background"
R2V = "a large object moves to the left on a beige background"
SEED = 7
SCALE = 2


def render(args: list[str]) -> None:
    from studio.cli import main as cli_main

    code = cli_main(["render", "--seed", str(SEED), "--overwrite", *args])
    if code:
        raise SystemExit(f"render failed ({code}): {args}")


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tiles = []
        for i, prompt in enumerate(T2I):
            path = Path(tmp) / f"t2i-{i}.png"
            render(["--prompt", prompt, "--out", str(path)])
            tiles.append(np.asarray(Image.open(path).convert("RGB")))
        row = np.concatenate(tiles, axis=1)
        Image.fromarray(row).resize((row.shape[1] * SCALE, row.shape[0] * SCALE),
                                    Image.NEAREST).save(OUT / "t2i.png")
        (OUT / "t2i.txt").write_text("\n".join(T2I) + "\n")
        render(["--mode", "t2v", "--prompt", T2V, "--out", str(OUT / "t2v.gif")])
        render(["--mode", "i2v", "--prompt", I2V, "--first-frame", str(Path(tmp) / "t2i-0.png"),
                "--out", str(OUT / "i2v.gif")])
        # the reference: an object alone, rendered by the world's own renderer
        from studio.tiny import world

        spec = world.SceneSpec("white", (world.ObjectSpec("orange", "triangle", "large",
                                                          "center", "still"),), False)
        ref = world.render_image(spec, 64, 64, np.random.default_rng(SEED))
        ref_path = OUT / "r2v-reference.png"
        Image.fromarray(ref).save(ref_path)
        render(["--mode", "r2v", "--prompt", R2V, "--reference", str(ref_path),
                "--out", str(OUT / "r2v.gif")])
    print(f"samples written to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
