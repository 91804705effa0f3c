"""``python -m studio``: launches the studio.

Until the studio window lands (issue 4), this renders a sample image and a sample video on the
embedded default model with the CLI and prints where they are. Arguments are passed to
``studio`` (the CLI) when given, e.g. ``python -m studio models``.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from studio.cli import main as cli_main

    argv = sys.argv[1:] if argv is None else argv
    if argv:
        return cli_main(argv)
    out = Path.cwd() / "out" / "samples"
    print("Diffusion Studio: rendering samples on the embedded model (the studio window comes "
          "with issue 4)")
    for args in (["--prompt", "a small red star in the top left corner on a grass background",
                  "--seed", "7", "--out", str(out / "sample.png")],
                 ["--mode", "t2v", "--prompt", "a blue circle slides to the right across a "
                  "night sky", "--seed", "7", "--out", str(out / "sample.mp4")]):
        code = cli_main(["render", *args])
        if code:
            return code
    print(f"samples are in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
