"""`studio render` and `studio models` end to end, in a subprocess like a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from studio.store.export import read_frames, read_metadata
from tests.conftest import CASES, sigterm_and_wait

ROOT = Path(__file__).resolve().parents[2]


def studio(*args, home: Path, check_rc: int | None = 0) -> subprocess.CompletedProcess:
    env = dict(os.environ, STUDIO_HOME=str(home), HF_HUB_OFFLINE="1",
               HF_HUB_CACHE=str(home / "hub"))
    proc = subprocess.run([sys.executable, "-m", "studio", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    if check_rc is not None:
        assert proc.returncode == check_rc, proc.stderr + proc.stdout
    return proc


@pytest.fixture()
def home(tmp_path) -> Path:
    return tmp_path / "home"


def studio_inproc(capsys, *args) -> tuple[int, str, str]:
    """The CLI in this process (no interpreter start-up): (exit code, stdout, stderr)."""
    from studio.cli import main

    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_png_and_mp4_carry_a_request_that_reproduces_them(tmp_path, home):
    png = tmp_path / "a.png"
    out = studio("render", "--prompt", "a red circle", "--out", png, "--steps", "4", home=home)
    assert "wrote" in out.stdout and png.exists()
    meta = read_metadata(png)
    req = meta["request"]
    assert req["prompt"] == "a red circle" and req["model"] == "embedded"
    assert req["width"] == 64 and req["num_frames"] == 1 and len(req["model_hash"]) == 32
    assert meta["environment"]["dtype"] == "float32"
    from PIL import Image

    assert "Seed: " in Image.open(png).text["parameters"]

    mp4 = tmp_path / "a.mp4"
    studio("render", "--prompt", "a red circle", "--mode", "t2v", "--steps", "4", "--out", mp4,
           home=home)
    vmeta = read_metadata(mp4)["request"]
    assert vmeta["mode"] == "t2v" and vmeta["num_frames"] == 9
    probe = __import__("av").open(str(mp4))
    stream = probe.streams.video[0]
    assert stream.codec_context.name == "h264" and stream.codec_context.pix_fmt == "yuv420p"
    probe.close()

    # case 003: the metadata alone re-runs the request to the same pixels (exactly for the
    # lossless PNG and WebP; the MP4 re-run is compared after H.264 on both sides)
    webp = tmp_path / "a.webp"
    studio("render", "--from", mp4, "--out", webp, home=home)
    for src, dst in ((png, tmp_path / "again.png"), (webp, tmp_path / "again.webp"),
                     (mp4, tmp_path / "again.mp4")):
        proc = studio("render", "--from", src, "--out", dst, home=home)
        assert read_metadata(dst)["request"] == read_metadata(src)["request"]
        a, b = read_frames(src).astype(np.float64), read_frames(dst).astype(np.float64)
        if src.suffix != ".mp4":
            assert "identical pixels" in proc.stdout and np.array_equal(a, b)
        else:
            # Usually byte-identical; under a loaded machine one re-run in a few gives another
            # H.264 stream of the same clip (43.9 dB seen in a full-suite run, 64 dB by hand,
            # while the lossless WebP re-runs above stay identical; cause not found yet). A
            # different seed or prompt is far below 30 dB.
            mse = ((a - b) ** 2).mean()
            assert mse == 0 or 10 * np.log10(255**2 / mse) > 40, proc.stdout


def test_gif_webp_and_image_inputs(tmp_path, home):
    gif = tmp_path / "a.gif"
    studio("render", "--prompt", "a star", "--mode", "t2v", "--steps", "2", "--frames", "5",
           "--out", gif, home=home)
    assert read_frames(gif).shape[0] == 5 and read_metadata(gif)["request"]["num_frames"] == 5
    webp = tmp_path / "b.webp"
    proc = studio("render", "--first-frame", CASES / "002-init-image-modes" / "gray_alpha.png",
                  "--prompt", "a star", "--steps", "2", "--out", webp, home=home)
    assert "48x80" in proc.stderr  # the UI/CLI says which size was used
    req = read_metadata(webp)["request"]
    assert req["mode"] == "i2v" and (req["width"], req["height"]) == (48, 80)
    assert "white" in req["first_frame"]["conversion"]
    # re-running with the same input works, with another input is refused
    studio("render", "--from", webp, "--first-frame",
           CASES / "002-init-image-modes" / "gray_alpha.png", "--out", tmp_path / "c.webp",
           home=home)
    bad = studio("render", "--from", webp, "--first-frame",
                 CASES / "002-init-image-modes" / "palette.png", "--out", tmp_path / "d.webp",
                 home=home, check_rc=2)
    assert "first_frame" in bad.stderr and "not the one" in bad.stderr
    missing = studio("render", "--from", webp, "--out", tmp_path / "e.webp", home=home,
                     check_rc=2)
    assert "--first-frame" in missing.stderr


@pytest.mark.parametrize("name", ["rgba_transparent.png", "gray16.png", "palette.png",
                                  "gray_alpha.png"])
@pytest.mark.parametrize("flag,mode,suffix", [("--init-image", "i2i", ".png"),
                                              ("--first-frame", "i2v", ".mp4")])
def test_case_002_every_pixel_format_is_accepted(tmp_path, capsys, name, flag, mode, suffix):
    out = tmp_path / f"out{suffix}"
    extra = ["--frames", "5"] if mode == "i2v" else []
    code, _, err = studio_inproc(capsys, "render", flag, CASES / "002-init-image-modes" / name,
                                 "--prompt", "a shape", "--steps", "2", *extra, "--out", out)
    assert code == 0, err
    frames = read_frames(out)
    req = read_metadata(out)["request"]
    assert req["mode"] == mode and frames.dtype == np.uint8
    assert req["width"] % 16 == 0 and req["height"] % 16 == 0
    assert frames.shape[1:3] == (req["height"], req["width"])
    field = "init_image" if mode == "i2i" else "first_frame"
    assert req[field]["conversion"] and req[field]["source"] == name
    # the conversion is said, by field and file, as the request records it
    said = [line for line in err.splitlines() if line.startswith(f"note: {field}: {name}: ")]
    assert len(said) == 1 and said[0].split(": ", 3)[3] in req[field]["conversion"], err
    if name == "gray_alpha.png":  # 40x72 fits no model: the size used is said
        assert "48x80" in err and (req["width"], req["height"]) == (48, 80)


@pytest.mark.parametrize("flag", ["--init-image", "--first-frame", "--reference"])
def test_case_001_truncated_input_is_refused_before_model_work(tmp_path, home, flag):
    out = tmp_path / "x.png"
    proc = studio("render", flag, CASES / "001-truncated-init-image" / "truncated.png",
                  "--prompt", "x", "--out", out, home=home, check_rc=2)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "truncated.png" in lines[0]
    assert "damaged or incomplete" in lines[0] and "Traceback" not in proc.stderr
    assert not out.exists() and not list(tmp_path.glob("*.tmp*"))


@pytest.mark.parametrize("args,field", [
    (["--width", "70"], "width"), (["--steps", "0"], "steps"),
    (["--mode", "t2v", "--frames", "10"], "num_frames"), (["--guidance", "500"], "guidance"),
    (["--seed", "-1"], "seed"), (["--model", "nobody/nothing"], "model"),
    (["--mode", "t2v", "--out-override", "x.png"], "out"),
    (["--mode", "r2v", "--reference", "README.md"], "references[0]"),
    (["--device", "cuda:9"], "device"), (["--device", "tpu"], "device"),
    (["--init-image", str(CASES / "002-init-image-modes" / "palette.png"), "--strength", "0"],
     "strength"),
    (["--model", "README.md"], "is a file"), (["--model-folder", "/no/such/dir"], "model-folder"),
    (["--mode", "t2v", "--frames", "2"], "--frames"),
    (["--model", ""], "model=''"), (["--out-override", ""], "out=''"),
])
def test_bad_input_exits_2_with_one_line_naming_the_field(tmp_path, capsys, args, field):
    out = tmp_path / "x.png"
    if args[:1] == ["--out-override"] and not args[1]:  # the empty --out itself
        out, args = "", []
    if "--out-override" in args:
        args = args[:2]
    code, _, err = studio_inproc(capsys, "render", "--prompt", "a circle", *args, "--out", out)
    assert code == 2 and field in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")
    assert not out or not out.exists()


@pytest.mark.parametrize("value,words", [("sage,tiles=64x100", "tiles: (64, 100)"),
                                         ("bogus", "kernel: 'bogus'"),
                                         (",,", "names no kernel")])
def test_a_bad_studio_attention_is_bad_input(tmp_path, capsys, monkeypatch, value, words):
    monkeypatch.setenv("STUDIO_ATTENTION", value)
    out = tmp_path / "x.png"
    code, _, err = studio_inproc(capsys, "render", "--prompt", "a circle", "--out", out)
    assert code == 2 and err.startswith("error: STUDIO_ATTENTION") and words in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_output_problems_are_found_before_model_work(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "existing.png"
    folder.mkdir()
    code, _, err = studio_inproc(capsys, "render", "--prompt", "x", "--out", folder)
    assert code == 2 and "is a folder" in err
    init = tmp_path / "in.png"
    init.write_bytes((CASES / "002-init-image-modes" / "palette.png").read_bytes())
    code, _, err = studio_inproc(capsys, "render", "--init-image", init, "--prompt", "x",
                                 "--out", init)
    assert code == 2 and "is also an input" in err
    assert init.read_bytes() == (CASES / "002-init-image-modes" / "palette.png").read_bytes()
    # a studio project's stored results are not a place for renders
    from studio.store.project import Project

    Project.create(tmp_path / "proj").close()
    code, _, err = studio_inproc(capsys, "render", "--prompt", "x", "--out",
                                 tmp_path / "proj" / "media" / "ab" / "x.png")
    assert code == 2 and "out='" in err and "is one of the project's own files" in err
    assert not (tmp_path / "proj" / "media" / "ab").exists()
    # a read-only file is refused before any model work (as root, os.access says every file
    # is writable, so the check is made to see what a user account sees)
    import os

    locked = tmp_path / "locked.png"
    locked.write_bytes(b"keep me")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == locked
                        else real_access(p, mode, **kw))
    code, _, err = studio_inproc(capsys, "render", "--prompt", "x", "--out", locked)
    assert code == 2 and "read-only" in err and locked.read_bytes() == b"keep me"
    # an existing output is a result (it carries its request): replaced only on --overwrite
    kept = tmp_path / "kept.png"
    kept.write_bytes(b"an earlier result")
    code, _, err = studio_inproc(capsys, "render", "--prompt", "x", "--out", kept)
    assert code == 2 and "the file exists; pass --overwrite" in err
    assert kept.read_bytes() == b"an earlier result"
    code, _, err = studio_inproc(capsys, "render", "--prompt", "x", "--steps", "1",
                                 "--overwrite", "--out", kept)
    assert code == 0, err
    assert read_metadata(kept)["request"]["prompt"] == "x"


def test_overwrite_keeps_permissions_writes_through_links_and_spares_devices(tmp_path, capsys):
    import os
    import stat

    target = tmp_path / "target.png"
    target.write_bytes(b"an earlier result")
    os.chmod(target, 0o640)
    link = tmp_path / "link.png"
    link.symlink_to(target)
    code, _, err = studio_inproc(capsys, "render", "--prompt", "x", "--steps", "1",
                                 "--overwrite", "--out", link)
    assert code == 0, err
    assert link.is_symlink() and read_metadata(target)["request"]["prompt"] == "x"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    code, _, err = studio_inproc(capsys, "render", "--prompt", "x", "--overwrite", "--out", fifo)
    assert code == 2 and "is not a regular file" in err and stat.S_ISFIFO(fifo.stat().st_mode)


def test_an_unusable_studio_home_is_bad_input(tmp_path, capsys, monkeypatch):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    monkeypatch.setenv("STUDIO_HOME", str(a_file / "home"))
    code, _, err = studio_inproc(capsys, "render", "--prompt", "x", "--out", tmp_path / "o.png")
    assert code == 2 and err.startswith("error: STUDIO_HOME=") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o.png").exists()


def test_an_image_re_run_as_a_video_says_what_changed(tmp_path, capsys):
    png, gif = tmp_path / "a.png", tmp_path / "b.gif"
    code, _, err = studio_inproc(capsys, "render", "--prompt", "x", "--steps", "1", "--out", png)
    assert code == 0, err
    code, out, err = studio_inproc(capsys, "render", "--from", png, "--mode", "t2v", "--steps",
                                   "1", "--out", gif)
    assert code == 0, err
    assert "with changes to:" in out and "mode" in out and gif.exists()


def test_samples_replace_their_own_earlier_samples(monkeypatch):
    import studio.__main__ as entry

    calls = []
    monkeypatch.setattr("studio.cli.main", lambda argv: calls.append(argv) or 0)
    assert entry.render_samples() == 0
    assert len(calls) == 2 and all("--overwrite" in argv for argv in calls)


def test_the_fit_to_the_model_is_recorded_in_the_request(tmp_path, capsys):
    out = tmp_path / "o.png"
    code, _, err = studio_inproc(capsys, "render", "--init-image",
                                 CASES / "002-init-image-modes" / "palette.png", "--width", "64",
                                 "--height", "64", "--steps", "2", "--prompt", "x", "--out", out)
    assert code == 0, err
    conversion = read_metadata(out)["request"]["init_image"]["conversion"]
    assert "64x48 resized to cover 64x64 and centre-cropped" in conversion


def test_models_table(home):
    proc = studio("models", home=home)
    header, *rows = proc.stdout.strip().splitlines()
    assert header.split()[:3] == ["MODEL", "FAMILY", "MODES"]
    assert any(r.startswith("embedded") and "t2v" in r and " ok" in r for r in rows)


def test_bad_request_in_file_and_internal_error(tmp_path, capsys, monkeypatch):
    # metadata that is JSON but not a valid request: bad input, named field
    bad = tmp_path / "weird.png"
    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_itxt("studio:request", json.dumps({"mode": "t2i", "prompt": 5}))
    Image.new("RGB", (8, 8)).save(bad, pnginfo=info)
    code, _, err = studio_inproc(capsys, "render", "--from", bad, "--out", tmp_path / "o.png")
    assert code == 2 and "not usable" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1

    # a bug: exit 1, a message and the log file that holds the traceback
    import studio.store.export as export

    def broken(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(export, "write_result", broken)
    code, _, err = studio_inproc(capsys, "render", "--prompt", "x", "--steps", "1", "--out",
                                 tmp_path / "o.png")
    assert code == 1 and "disk on fire" in err and "Traceback" not in err
    log = err.split("details in ")[1].rstrip(")\n")
    assert "Traceback" in Path(log).read_text() and not (tmp_path / "o.png").exists()


def test_a_full_disk_is_named_as_such(tmp_path, capsys, monkeypatch):
    """The machine's failure (disk full) is not called an internal error: exit code 2, as
    for any problem the user can fix, with one line and no log file to look up."""
    import errno as errno_module

    import studio.store.export as export

    def full(*a, **k):
        raise OSError(errno_module.ENOSPC, "No space left on device", str(tmp_path / "o.png"))

    monkeypatch.setattr(export, "write_result", full)
    code, _, err = studio_inproc(capsys, "render", "--prompt", "x", "--steps", "1", "--out",
                                 tmp_path / "o.png")
    assert code == 2 and "internal error" not in err
    assert err.strip().splitlines()[-1] == (f"error: cannot write {tmp_path / 'o.png'}: No space left on device "
                           f"(nothing was left half written)")


def test_a_full_disk_names_the_out_file_not_the_temporary_one(tmp_path, capsys, monkeypatch):
    """The encoder fails on the temporary file the write goes through: the error names
    --out, as the user wrote it, and leaves no temporary file behind."""
    import errno as errno_module

    from PIL import Image

    def full(self, fp, *a, **k):
        raise OSError(errno_module.ENOSPC, "No space left on device", str(fp))

    monkeypatch.setattr(Image.Image, "save", full)
    out = tmp_path / "o.png"
    code, _, err = studio_inproc(capsys, "render", "--prompt", "x", "--steps", "1", "--out",
                                 out)
    assert code == 2 and err.strip().splitlines()[-1] == (
        f"error: cannot write {out}: No space left on device (nothing was left half written)")
    assert list(tmp_path.iterdir()) == []


def test_options_the_mode_does_not_use_are_refused(tmp_path, capsys):
    for extra, message in ((("--strength", "0.5"), "strength: only used in mode i2i"),
                           (("--fps", "30"), "fps: only used for videos")):
        code, _, err = studio_inproc(capsys, "render", "--prompt", "x", "--steps", "1",
                                     "--out", tmp_path / "o.png", *extra)
        assert code == 2 and message in err and "this is t2i" in err
        assert not (tmp_path / "o.png").exists()


def test_mixed_mode_inputs_and_a_default_strength_are_explained(tmp_path, capsys):
    image = CASES / "002-init-image-modes" / "palette.png"
    out = tmp_path / "o.png"
    code, _, err = studio_inproc(capsys, "render", "--prompt", "x", "--init-image", image,
                                 "--first-frame", image, "--out", out)
    assert code == 2 and "--init-image and --first-frame" in err and "--mode" in err
    # one step at the default strength 0.8 runs no step: say it is the default, and both fixes
    code, _, err = studio_inproc(capsys, "render", "--prompt", "x", "--init-image", image,
                                 "--steps", "1", "--out", out)
    assert code == 2 and "(--strength, the default)=0.8" in err
    assert "steps must be >= 2" in err and "strength must be >= 1" in err
    code, _, err = studio_inproc(capsys, "render", "--prompt", "x", "--init-image", image,
                                 "--strength", "0", "--out", out)
    assert code == 2 and "strength 0 runs no step" in err and "the default" not in err
    assert not out.exists()


def test_path_problems_are_named_plainly(tmp_path, capsys):
    a_file = tmp_path / "file.png"
    a_file.write_bytes(b"x")
    code, _, err = studio_inproc(capsys, "render", "--prompt", "x", "--out", a_file / "x.png")
    assert code == 2 and f"{a_file} is a file, not a folder" in err and "Errno" not in err
    code, _, err = studio_inproc(capsys, "render", "--from", tmp_path / "missing.png",
                                 "--out", tmp_path / "o.png")
    assert code == 2 and "no such file" in err and "Errno" not in err
    code, _, err = studio_inproc(capsys, "render", "--from", tmp_path, "--out",
                                 tmp_path / "o.png")
    assert code == 2 and f"from={str(tmp_path)!r}: is a folder" in err
    code, _, err = studio_inproc(capsys, "models", "--model-folder", tmp_path / "nowhere")
    assert code == 2 and "model-folder" in err


def test_a_mistyped_command_is_not_taken_for_a_project_folder(tmp_path, monkeypatch, capsys):
    from studio.__main__ import main

    monkeypatch.chdir(tmp_path)
    assert main(["rendr", "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'render'" in err and "./rendr" in err
    assert main(["--sample"]) == 2 and "'--samples'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_ignored_prompt_parts_get_a_note(tmp_path, capsys):
    out = tmp_path / "o.png"
    code, _, err = studio_inproc(capsys, "render", "--prompt", "une étoile rouge on grass",
                                 "--negative-prompt", "blurry", "--guidance", "1", "--steps",
                                 "1", "--seed", "1", "--out", out)
    assert code == 0, err
    assert "negative prompt: ignored at guidance 1" in err
    assert "does not know \u201cune\u201d, \u201c\u00e9toile\u201d, \u201crouge\u201d" in err
    assert "grass" not in err.split("does not know")[1]


def test_a_control_character_in_the_prompt_is_shown_escaped(tmp_path, capsys):
    code, _, err = studio_inproc(capsys, "render", "--prompt", "a\x01 red circle", "--steps",
                                 "1", "--seed", "1", "--out", tmp_path / "o.png")
    assert code == 0, err
    assert "does not know \u201c\\x01\u201d" in err and "\u201c\u201d" not in err


def test_a_refused_request_changes_nothing_on_disk(tmp_path, capsys):
    code, _, err = studio_inproc(capsys, "render", "--prompt", "x", "--steps", "0",
                                 "--out", tmp_path / "new" / "deep" / "x.png")
    assert code == 2 and "steps" in err
    assert not (tmp_path / "new").exists()


def test_sigterm_stops_a_render_like_ctrl_c(tmp_path, home):
    """``kill`` mid-render: exit 143 with one line, the engine child gone, no file and no
    temporary file left, no traceback."""
    import signal
    import time

    out = tmp_path / "out"
    env = dict(os.environ, STUDIO_HOME=str(home), HF_HUB_OFFLINE="1",
               HF_HUB_CACHE=str(home / "hub"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "studio", "render", "--mode", "t2v", "--frames", "17",
         "--width", "128", "--height", "128", "--steps", "60", "--prompt", "a red circle",
         "--seed", "1", "--out", str(out / "clip.mp4")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    time.sleep(8)  # past start-up, inside the job (which takes minutes)
    err = sigterm_and_wait(proc)
    assert proc.returncode == 143, err[-2000:]
    assert err.strip().splitlines()[-1] == "terminated" and "Traceback" not in err, err
    assert not out.exists() or not any(out.iterdir())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the engine child exits with its parent
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("the engine child outlived the CLI")


def test_a_mask_of_another_size_is_refused_and_a_crop_is_said(tmp_path, capsys):
    from PIL import Image

    rng = np.random.default_rng(0)
    init = tmp_path / "init.png"
    Image.fromarray(rng.integers(0, 255, (120, 200, 3), dtype=np.uint8)).save(init)
    mask = tmp_path / "mask.png"
    Image.fromarray(np.full((37, 100), 255, np.uint8)).save(mask)
    code, _, err = studio_inproc(capsys, "render", "--init-image", init, "--mask", mask,
                                 "--prompt", "a red circle", "--out", tmp_path / "o.png")
    assert code == 2 and "mask: 100x37 does not match the init image's 200x120" in err, err
    assert not (tmp_path / "o.png").exists()
    # an explicit size that crops the init image is said, not done silently
    code, _, err = studio_inproc(capsys, "render", "--init-image", init, "--width", "64",
                                 "--steps", "2", "--prompt", "a red circle",
                                 "--out", tmp_path / "o.png")
    assert code == 0, err
    assert ("note: init_image: the 200x120 image is resized to cover 64x64 and centre-cropped"
            in err), err


def test_a_video_file_without_a_mode_is_a_text_to_video(tmp_path, capsys):
    code, _, err = studio_inproc(capsys, "render", "--prompt", "a red circle moves left",
                                 "--steps", "2", "--out", tmp_path / "clip.mp4")
    assert code == 0, err
    assert "note: mode: text-to-video for the .mp4 output" in err
    assert read_frames(tmp_path / "clip.mp4").shape[0] == 9  # the model's default frames
    assert read_metadata(tmp_path / "clip.mp4")["request"]["mode"] == "t2v"
    # .webp is a still unless frames are asked for
    code, _, err = studio_inproc(capsys, "render", "--prompt", "a red circle", "--steps", "2",
                                 "--out", tmp_path / "still.webp")
    assert code == 0 and read_frames(tmp_path / "still.webp").shape[0] == 1, err


def test_trial_findings_long_names_huge_or_foreign_files_and_argparse_errors(tmp_path, capsys):
    """From the session-10 new-user trial: each is one line, exit 2, before model work."""
    import struct
    import zlib

    code, _, err = studio_inproc(capsys, "render", "--prompt", "x", "--out",
                                 tmp_path / ("a" * 300 + ".png"))
    assert code == 2 and "at most 255 are allowed" in err and "internal" not in err
    # a PNG whose header says 20000 x 20000 (Pillow's own bomb limit, above ours)
    png = bytearray((CASES / "002-init-image-modes" / "palette.png").read_bytes())
    ihdr = png.index(b"IHDR")
    png[ihdr + 4:ihdr + 12] = struct.pack(">II", 20000, 20000)
    png[ihdr + 17:ihdr + 21] = struct.pack(">I", zlib.crc32(bytes(png[ihdr:ihdr + 17])))
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(bytes(png))
    code, _, err = studio_inproc(capsys, "render", "--init-image", bomb, "--prompt", "x",
                                 "--out", tmp_path / "o.png")
    assert code == 2 and "is too large (400000000 pixels); at most 64000000" in err, err
    movie = tmp_path / "a.mp4"
    movie.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(64))
    code, _, err = studio_inproc(capsys, "render", "--init-image", movie, "--prompt", "x",
                                 "--out", tmp_path / "o.png")
    assert code == 2 and "a.mp4 is not an image this studio reads" in err
    with pytest.raises(SystemExit) as info:
        studio_inproc(capsys, "render", "--steps", "2.5", "--out", tmp_path / "o.png")
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "--steps" in err
    assert "see studio render --help" in err
    # a lone --reference makes a video: the refusal of a .png says which mode it took
    ref = CASES / "002-init-image-modes" / "palette.png"
    code, _, err = studio_inproc(capsys, "render", "--reference", ref, "--prompt", "x",
                                 "--out", tmp_path / "o.png")
    assert code == 2 and "(mode r2v)" in err
    assert not list(tmp_path.glob("o.*"))


def test_trial_findings_of_session_43(tmp_path, capsys, monkeypatch):
    """From the session-43 new-user trial: each was silently ignored, misleading, or an
    internal error after the render; now one line, exit 2, before model work."""
    def refused(*args):
        code, _, err = studio_inproc(capsys, "render", "--prompt", "x", *args)
        assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1
        assert "internal" not in err
        return err

    palette = CASES / "002-init-image-modes" / "palette.png"
    png = tmp_path / "o.png"
    # an empty name no longer drops the input (and the mode with it)
    assert "init_image (--init-image)='': give an image file" in refused(
        "--init-image", "", "--out", png)
    assert "references[0] (--reference)='': give an image file" in refused(
        "--reference", "", "--out", tmp_path / "o.mp4")
    assert "device='': must be auto" in refused("--device", "", "--out", png)
    # a mask alone says what it lacks (it named mode i2i, or the mask's colours)
    assert "give that image with --init-image" in refused("--mask", palette, "--out", png)
    # the mode a .png chose is said
    assert "from the .png suffix of --out; use .mp4" in refused("--frames", "9", "--out", png)
    # a link is written through: its target's name must be an output name too
    (tmp_path / "target.txt").write_text("notes")
    (tmp_path / "link.png").symlink_to(tmp_path / "target.txt")
    assert "is a link to" in refused("--out", tmp_path / "link.png", "--overwrite")
    assert (tmp_path / "target.txt").read_text() == "notes"
    # a typo in STUDIO_CPU_THREADS is not silently the default
    monkeypatch.setenv("STUDIO_CPU_THREADS", "atuo")
    assert "STUDIO_CPU_THREADS='atuo': must be auto" in refused("--out", png)
    monkeypatch.setenv("STUDIO_CPU_THREADS", " AUTO ")
    from studio.engine.worker import cpu_threads_auto

    assert cpu_threads_auto()
    monkeypatch.delenv("STUDIO_CPU_THREADS")
    # options are spelled whole, and an unknown one is named with its likely meaning
    for args, words in ((["--promp", "x"], "--promp: did you mean --prompt?"),
                        (["--Steps", "2"], "--Steps: did you mean --steps?")):
        with pytest.raises(SystemExit) as info:
            studio_inproc(capsys, "render", *args, "--out", png)
        err = capsys.readouterr().err
        assert info.value.code == 2 and words in err and "see studio render --help" in err
    assert not list(tmp_path.glob("o.*"))


def test_inputs_of_two_modes_name_those_two_modes(tmp_path, capsys):
    image = tmp_path / "in.png"
    Image.new("RGB", (64, 64), (200, 30, 30)).save(image)
    code, _, err = studio_inproc(capsys, "render", "--prompt", "x", "--init-image", image,
                                 "--reference", image, "--out", tmp_path / "o.png")
    assert code == 2 and err.strip() == ("error: mode: --init-image and --reference belong to "
                                         "different modes (i2i, r2v); pass --mode to choose one")
    assert not (tmp_path / "o.png").exists()


def test_review_inputs_that_escaped_as_internal_errors(tmp_path, capsys):
    """Inputs a review found escaping as "internal error" (exit 1): each is bad input now,
    one line naming the field, found before any model work."""
    out = tmp_path / "x.png"
    palette = CASES / "002-init-image-modes" / "palette.png"
    for args, words in (
        # a prompt with bytes that are not UTF-8 (a terminal in another encoding)
        (["--prompt", "caf\udce9 circle"], "prompt"),
        # a step count too large for a float, with a strength (i2i multiplies them)
        (["--prompt", "x", "--init-image", palette, "--steps", "1" + "0" * 400,
          "--strength", "0.5"], "steps (--steps)="),
        # --frames 0 for a video name: the video range, not the image one
        (["--prompt", "x", "--frames", "0", "--out-mp4"], "num_frames (--frames)=0: must be "
                                                          "in ["),
        # ~user of no user
        (["--prompt", "x", "--out-tilde"], "names no user"),
    ):
        target = out
        if "--out-mp4" in args:
            args, target = [a for a in args if a != "--out-mp4"], tmp_path / "x.mp4"
        if "--out-tilde" in args:
            args, target = [a for a in args if a != "--out-tilde"], "~no_such_user_9z/a.png"
        code, _, err = studio_inproc(capsys, "render", *args, "--out", target)
        assert code == 2 and words in err and "internal error" not in err, (args, err)
        assert "[1, 10000]" not in err  # a video name is checked as a video
        assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert not list(tmp_path.iterdir())
    code, _, err = studio_inproc(capsys, "render", "--from", "~no_such_user_9z/a.png",
                                 "--out", out)
    assert code == 2 and "from=" in err and "names no user" in err


def test_a_hand_edited_request_of_wrong_types_is_refused(tmp_path, capsys):
    from PIL import PngImagePlugin

    for fields, name in (({"num_frames": "nine"}, "num_frames"), ({"model_hash": 5},
                                                                  "model_hash")):
        bad = tmp_path / "edited.png"
        info = PngImagePlugin.PngInfo()
        from studio.core.request import GenerationRequest

        request = {**GenerationRequest(mode="t2i", model="embedded", prompt="a red circle",
                                       seed=1, steps=2, guidance_scale=5.0, width=64,
                                       height=64).to_dict(), **fields}
        info.add_itxt("studio:request", json.dumps(request))
        Image.new("RGB", (8, 8)).save(bad, pnginfo=info)
        code, _, err = studio_inproc(capsys, "render", "--from", bad, "--out",
                                     tmp_path / "o.png")
        assert code == 2 and "not usable" in err and name in err, err
        assert "internal error" not in err and not (tmp_path / "o.png").exists()


def test_a_non_utf8_file_name_and_a_damaged_from_file_keep_the_render(tmp_path, capsys):
    import os

    # an input file whose name is not UTF-8: its name is recorded readable, the PNG written
    raw = os.fsencode(str(tmp_path)) + b"/caf\xe9.png"
    with open(raw, "wb") as fh:
        fh.write((CASES / "002-init-image-modes" / "palette.png").read_bytes())
    png = tmp_path / "a.png"
    code, _, err = studio_inproc(capsys, "render", "--init-image", os.fsdecode(raw),
                                 "--prompt", "x", "--steps", "2", "--out", png)
    assert code == 0, err
    assert read_metadata(png)["request"]["init_image"]["source"] == "caf\ufffd.png"
    # a --from GIF whose frames are cut off after its header: the new render is written,
    # and the note says it was not compared
    gif = tmp_path / "clip.gif"
    code, _, err = studio_inproc(capsys, "render", "--prompt", "a red circle moves left",
                                 "--steps", "1", "--out", gif)
    assert code == 0, err
    damaged = tmp_path / "damaged.gif"
    data = gif.read_bytes()
    damaged.write_bytes(data[:len(data) * 2 // 3])
    assert read_metadata(damaged)["request"]["prompt"] == "a red circle moves left"
    with pytest.raises(Exception):  # noqa: B017 (whichever error the decoder raises)
        read_frames(damaged)
    again = tmp_path / "again.gif"
    code, out, err = studio_inproc(capsys, "render", "--from", damaged, "--out", again)
    assert code == 0, err
    assert again.exists() and "wrote" in out
    assert f"note: from: cannot decode the frames of {damaged}" in err


def test_a_file_created_at_the_output_while_rendering_is_kept(tmp_path, capsys):
    """Two renders to one name at once (or any program writing there meanwhile): the
    existence check ran before the job, so the write itself must not replace the file;
    the new result goes next to it, and a note says where."""
    from types import SimpleNamespace

    from studio.cli import write_new_result

    out = tmp_path / "same.png"
    event = SimpleNamespace(frames=np.full((1, 8, 8, 3), 9, np.uint8), fps=8.0,
                            request_json=json.dumps({"prompt": "a blue square"}),
                            environment={})
    out.write_bytes(b"the other render")
    (tmp_path / "same-2.png").write_bytes(b"and another")
    path = write_new_result(out, event, overwrite=False)
    assert path == tmp_path / "same-3.png" and read_frames(path)[0, 0, 0, 0] == 9
    assert out.read_bytes() == b"the other render"
    assert (tmp_path / "same-2.png").read_bytes() == b"and another"
    err = capsys.readouterr().err
    assert f"kept it, and wrote this result to {path}" in err
    # --overwrite replaces, as asked
    assert write_new_result(out, event, overwrite=True) == out and read_frames(out).shape[0] == 1
    with pytest.raises(FileExistsError):
        from studio.paths import atomic_write

        atomic_write(out, lambda tmp: Path(tmp).write_bytes(b"x"), replace=False)
    assert read_frames(out)[0, 0, 0, 0] == 9 and not list(tmp_path.glob(".*tmp*"))
