"""Where the studio keeps its own files, and atomic file writes.

The user folder is ``$STUDIO_HOME`` if set, else ``$XDG_DATA_HOME/diffusion-studio`` (default
``~/.local/share/diffusion-studio``). It holds settings, logs and caches; projects live where
the user puts them. Nothing is created at import time.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Callable
from glob import escape as glob_escape
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ASSETS = REPO_ROOT / "assets"


def expand_path(text: str | os.PathLike, field: str) -> Path:
    """``text`` as a path with a leading ``~`` or ``~user`` expanded.

    Raises:
        ValueError: naming ``field``, when ``~user`` names no user of this machine (or the
            home folder is unknown), where :meth:`pathlib.Path.expanduser` raises RuntimeError.
    """
    try:
        return Path(text).expanduser()
    except RuntimeError:
        head = str(text).split(os.sep, 1)[0]
        raise ValueError(f"{field}={str(text)!r}: {head!r} names no user of this machine (or "
                         f"the home folder is unknown); give the full path") from None


def user_dir() -> Path:
    """The studio's user folder (created on first use).

    Raises:
        ValueError: the folder cannot be created or is not a folder, naming the variable
            that chose it (``STUDIO_HOME``, ``XDG_DATA_HOME`` or the home folder).
    """
    env = os.environ.get("STUDIO_HOME")
    if env:
        path, source = expand_path(env, "STUDIO_HOME"), f"STUDIO_HOME={env!r}"
    else:
        xdg = os.environ.get("XDG_DATA_HOME")
        base = xdg or os.path.join(Path.home(), ".local", "share")
        path = Path(base) / "diffusion-studio"
        source = f"XDG_DATA_HOME={xdg!r}" if xdg else f"the home folder {str(Path.home())!r}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(13, "not writable")
    except OSError as exc:
        raise ValueError(f"{source}: cannot use {path} as the studio's folder for settings and "
                         f"logs ({exc.strerror or exc}); set STUDIO_HOME to a writable "
                         f"folder") from None
    return path


def log_dir() -> Path:
    path = user_dir() / "logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def fsync_dir(folder: Path) -> None:
    """Makes ``folder``'s entries (a rename into it) durable, where the platform allows
    (errors are ignored: some file systems cannot fsync a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], None], *,
                 replace: bool = True) -> Path:
    """Writes a file atomically: ``write(tmp_path)`` fills a temporary file in the same
    folder, which is fsynced and renamed over ``path``; a failure leaves no partial file.

    Args:
        path: the destination.
        write: called with the temporary path (keeps the destination's suffix, so encoders
            that pick a format from the extension work).
        replace: False never replaces an existing ``path``, even one created meanwhile by
            another program (the file is linked into place, which fails if the name exists).
    Returns:
        The destination as a Path.
    Raises:
        FileExistsError: ``replace`` is False and ``path`` exists (nothing is written).
        OSError: as the writing raised it (disk full, quota, read-only disk), naming
            ``path`` instead of the temporary file, which the user never asked for.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.stem}.", suffix=f".tmp{dest.suffix}",
                               dir=dest.parent)
    os.close(fd)
    try:
        # mkstemp makes 0600; results are ordinary user files, and a replaced file keeps its
        # permissions
        mode = 0o644
        if dest.is_file():
            mode = stat.S_IMODE(dest.stat().st_mode)
        os.chmod(tmp, mode)
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        if replace:
            os.replace(tmp, dest)
        else:
            try:
                os.link(tmp, dest)  # atomic, and refuses an existing name
            except FileExistsError:
                raise
            except OSError:  # a file system without hard links (FAT, some shares)
                if os.path.lexists(dest):
                    raise FileExistsError(errno.EEXIST, "File exists", str(dest)) from None
                os.replace(tmp, dest)
            else:
                os.unlink(tmp)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.filename == tmp and exc.errno is not None:
            raise type(exc)(exc.errno, exc.strerror, str(dest)) from exc
        raise
    fsync_dir(dest.parent)
    _sweep_stale_temporaries(dest)
    return dest


#: a temporary file of :func:`atomic_write` untouched this long was left by a killed write
STALE_TEMPORARY_S = 3600.0


def _sweep_stale_temporaries(dest: Path) -> None:
    """Deletes the temporary files earlier writes of ``dest`` left behind when their process
    was killed (``.<stem>.<random>.tmp<suffix>``, untouched for :data:`STALE_TEMPORARY_S`:
    a write in progress touches its file all along). Best effort: a failure is ignored."""
    import time

    cutoff = time.time() - STALE_TEMPORARY_S
    try:
        for tmp in dest.parent.glob(f".{glob_escape(dest.stem)}.*.tmp{glob_escape(dest.suffix)}"):
            try:
                if tmp.is_file() and not tmp.is_symlink() and tmp.stat().st_mtime < cutoff:
                    tmp.unlink()
            except OSError:
                pass
    except OSError:
        pass


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """:func:`atomic_write` of ``data``."""
    return atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """:func:`atomic_write` of UTF-8 ``text``."""
    return atomic_write_bytes(path, text.encode("utf-8"))
