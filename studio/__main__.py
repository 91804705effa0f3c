"""``python -m studio``: the studio window, or the CLI.

* ``python -m studio`` opens the studio on the last project (or a new
  ``~/DiffusionStudio/Untitled``); ``python -m studio FOLDER`` opens (or creates) that project.
* ``python -m studio render ...`` / ``python -m studio models`` run the headless CLI.
* ``python -m studio --samples`` renders a sample image and a sample video on the embedded
  model with the CLI, without a window, and prints where they are.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

CLI_COMMANDS = ("render", "models")


def render_samples() -> int:
    """Renders the sample image and video into ./out/samples with the CLI."""
    from studio.cli import main as cli_main

    out = Path.cwd() / "out" / "samples"
    print("Diffusion Studio: rendering samples on the embedded model")
    for args in (["--prompt", "a small red star in the top left corner on a grass background",
                  "--seed", "7", "--out", str(out / "sample.png")],
                 ["--mode", "t2v", "--prompt", "a blue circle slides to the right across a "
                  "night sky", "--seed", "7", "--out", str(out / "sample.mp4")]):
        code = cli_main(["render", "--overwrite", *args])  # its own samples, made again
        if code:
            return code
    print(f"samples are in {out}")
    return 0


def _exists(text: str) -> bool:
    """Whether ``text`` names an existing path (False for a ``~user`` of no user)."""
    from studio.paths import expand_path

    try:
        return expand_path(text, "project").exists()
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    """Dispatches to the CLI, the sample renderer or the studio window."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip().replace("``", ""))
        return 0
    if argv and argv[0] in CLI_COMMANDS:
        from studio.cli import main as cli_main

        return cli_main(argv)
    if argv and argv[0] == "--samples":
        return render_samples()
    if argv and not _exists(argv[0]):
        # a mistyped command or option must not become a new project folder
        word = argv[0]
        close = difflib.get_close_matches(word, (*CLI_COMMANDS, "--samples"), n=1, cutoff=0.6)
        if word.startswith("-") or (close and "/" not in word):
            hint = f"did you mean {close[0]!r}? " if close else ""
            print(f"error: unknown command or option {word!r}; {hint}commands: "
                  f"{', '.join(CLI_COMMANDS)}, --samples, --help"
                  + ("" if word.startswith("-") else
                     f". To make a project folder with that name, pass ./{word}"),
                  file=sys.stderr)
            return 2
    from studio.ui.app import main as ui_main

    return ui_main(argv)


if __name__ == "__main__":
    sys.exit(main())
