"""A project on disk: ``project.sqlite`` plus the content-addressed ``media/`` folder.

Nothing is ever lost:

* One sqlite3 connection per open project (and a lock file, so two studios cannot write the
  same project), WAL journal, foreign keys on, a busy timeout.
* ``synchronous=FULL``: in WAL mode NORMAL already survives a killed process (a committed
  transaction is in the WAL, which the OS holds), but an OS crash or power cut can drop the
  last commits. FULL fsyncs the WAL at every commit, so an edit the user saw is on the disk
  even after a power cut. Our commits come at human rate (one per edit or result, a few per
  second while dragging), and a WAL fsync costs about a millisecond on an SSD, so the price
  is small. Pass ``synchronous="NORMAL"`` to :meth:`Project.open` to trade that away.
* Every document change is saved when it happens: the project subscribes to its
  :class:`~studio.core.document.Document` and applies each event list (one undo step, one
  result) in one transaction. ``core`` knows nothing of SQLite.
* Numbered migrations with stable ids, recorded in ``schema_version``.
* JSON text columns only; no pickle anywhere.
* On open, variants left ``running`` by a crash become ``interrupted`` (retryable) and leave
  the queue; ``queued`` ones stay queued in their order.

The undo history is not saved: a reopened project starts with an empty history.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studio.core.document import (
    QUEUE_CHANGED,
    SHOTS_ADDED,
    SHOTS_CHANGED,
    SHOTS_MOVED,
    SHOTS_REMOVED,
    VARIANTS_ADDED,
    VARIANTS_CHANGED,
    VARIANTS_REMOVED,
    Artifact,
    ChangeEvent,
    Document,
    Shot,
    Status,
    Variant,
    json_strings,
)
from studio.store.media import GarbagePlan, MediaStore

try:  # POSIX advisory lock; elsewhere a second writer is only caught by SQLite's own locks
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

DB_NAME = "project.sqlite"
MEDIA_DIR = "media"
LOCK_NAME = "project.lock"
BUSY_TIMEOUT_MS = 5000
INTERRUPTED_MESSAGE = "The studio stopped while this was generating. Retry to run it again."


# the document changes a project writes (history and selection events are not saved)
_SAVED_KINDS = frozenset({VARIANTS_ADDED, VARIANTS_CHANGED, VARIANTS_REMOVED, SHOTS_ADDED,
                          SHOTS_CHANGED, SHOTS_REMOVED, SHOTS_MOVED, QUEUE_CHANGED})


class ProjectError(Exception):
    """A project cannot be opened or used; the message says why in plain words."""


class ProjectLockedError(ProjectError):
    """The project is open in another studio window or process."""


@dataclass(frozen=True)
class Migration:
    """One schema step. ``id`` is stable forever; never renumber or edit a released one."""

    id: int
    name: str
    statements: tuple[str, ...]


_STATUSES = ", ".join(f"'{s.value}'" for s in Status)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "initial_schema",
        (
            """CREATE TABLE media (
                id TEXT PRIMARY KEY,
                kind TEXT NOT NULL CHECK (kind IN ('image', 'video')),
                ext TEXT NOT NULL,
                pixels_id TEXT NOT NULL,
                meta_json TEXT NOT NULL,
                created_at REAL NOT NULL
            )""",
            "CREATE INDEX media_pixels ON media (pixels_id)",
            f"""CREATE TABLE variants (
                id TEXT PRIMARY KEY,
                parent_id TEXT REFERENCES variants (id) DEFERRABLE INITIALLY DEFERRED,
                request_json TEXT NOT NULL,
                request_id TEXT NOT NULL,
                status TEXT NOT NULL CHECK (status IN ({_STATUSES})),
                name TEXT NOT NULL,
                starred INTEGER NOT NULL CHECK (starred IN (0, 1)),
                error TEXT,
                created_at REAL NOT NULL
            )""",
            "CREATE INDEX variants_parent ON variants (parent_id)",
            """CREATE TABLE artifacts (
                variant_id TEXT NOT NULL
                    REFERENCES variants (id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
                position INTEGER NOT NULL,
                media_id TEXT NOT NULL REFERENCES media (id) DEFERRABLE INITIALLY DEFERRED,
                kind TEXT NOT NULL CHECK (kind IN ('image', 'video')),
                PRIMARY KEY (variant_id, position)
            )""",
            "CREATE INDEX artifacts_media ON artifacts (media_id)",
            """CREATE TABLE shots (
                id TEXT PRIMARY KEY,
                position INTEGER NOT NULL,
                variant_id TEXT NOT NULL
                    REFERENCES variants (id) DEFERRABLE INITIALLY DEFERRED,
                in_frame INTEGER NOT NULL,
                out_frame INTEGER,
                duration_s REAL
            )""",
            "CREATE INDEX shots_variant ON shots (variant_id)",
            """CREATE TABLE queue (
                variant_id TEXT PRIMARY KEY
                    REFERENCES variants (id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
                position INTEGER NOT NULL
            )""",
        ),
    ),
    Migration(
        2,
        "draft",
        (
            # the settings panel's unsent request (one row): a crash keeps the prompt, the
            # inputs and the branch the user was making
            """CREATE TABLE draft (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                state_json TEXT NOT NULL,
                saved_at REAL NOT NULL
            )""",
        ),
    ),
)


def _refuse_a_lost_database(db_path: Path, media_dir: Path) -> None:
    """An empty (0-byte) database file beside stored media: the project's database was
    lost (truncated by a crash, a full disk or a copy gone wrong). SQLite would take the
    empty file for a new database, and the project would open empty, its media orphaned.

    Raises:
        ProjectError: naming the file and the media it would orphan.
    """
    try:
        if db_path.stat().st_size != 0:
            return
    except FileNotFoundError:
        return
    stored = sum(1 for p in media_dir.rglob("*") if p.is_file()) if media_dir.is_dir() else 0
    if stored:
        raise ProjectError(f"folder: {db_path} is empty (0 bytes) while {media_dir} holds "
                           f"{stored} stored file(s): the project's database was lost; "
                           f"restore it from a backup (or move the folder's media away to "
                           f"start a new project there)")


def _rollback(conn: sqlite3.Connection, *statements: str) -> None:
    """Runs the rollback ``statements`` of a failed transaction, when one is still open:
    SQLite ends the transaction itself on some errors (SQLITE_FULL, SQLITE_IOERR), and a
    failing rollback must not hide the error that caused it (it is logged)."""
    if not conn.in_transaction:
        return
    try:
        for statement in statements:
            conn.execute(statement)
    except sqlite3.Error:
        log.warning("%s failed after an error", statements[0], exc_info=True)


class Project:
    """An open project folder; its :attr:`document` is saved on every change.

    Use from the thread that opened it. Close it (or use ``with``) to release the lock.

    Attributes:
        folder: the project folder.
        document: the loaded document; edit it, and every change lands in the database.
        media: the :class:`MediaStore`.
        recovered: ids of variants that were running at open time and are now interrupted.
    """

    def __init__(self, folder: Path, conn: sqlite3.Connection, lock: Any) -> None:
        """Use :meth:`open` or :meth:`create`."""
        self.folder = folder
        self._conn = conn
        self._lock = lock
        self._depth = 0
        # document changes not in the file yet: a save that failed (disk full, I/O error) is
        # tried again, whole, with the next change (and at close), so the file catches up with
        # what the user sees instead of silently missing an edit
        self._unsaved: list[ChangeEvent] = []
        self._unsaved_written = False
        # told when saving the document's changes fails (the error, the changes pending) and
        # when they are saved after a failure (None, 0); without it the error is raised
        self.on_save_state: Callable[[BaseException | None, int], None] | None = None
        self._save_failing = False
        self._raising = 0  # depth of save_errors_raised()
        self.media = MediaStore(folder / MEDIA_DIR, conn, self.transaction)
        self.recovered: list[str] = []
        self.document = Document()
        self._unsubscribe = lambda: None

    # -- opening ----------------------------------------------------------------------------
    @classmethod
    def create(cls, folder: str | os.PathLike[str], **kwargs: Any) -> Project:
        """Creates a new project in ``folder`` (made if missing) and opens it.

        Raises:
            FileExistsError: the folder already holds a project.
        """
        folder = Path(folder)
        if (folder / DB_NAME).exists():
            raise FileExistsError(f"folder: {folder} already holds a project")
        return cls.open(folder, create=True, **kwargs)

    @classmethod
    def open(
        cls,
        folder: str | os.PathLike[str],
        *,
        create: bool = False,
        synchronous: str = "FULL",
    ) -> Project:
        """Opens (or with ``create``, creates) the project in ``folder``.

        Runs pending migrations, turns ``running`` variants into ``interrupted``, and loads
        the document.

        Raises:
            FileNotFoundError: no project there and not ``create``.
            ValueError: ``synchronous`` is not NORMAL or FULL.
            ProjectLockedError: another process has the project open.
            ProjectError: the project was written by a newer studio, its schema is unknown, or
                its database file is not a database or is damaged.
        """
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous: expected 'NORMAL' or 'FULL', got {synchronous!r}")
        folder = Path(folder)
        db_path = folder / DB_NAME
        if not db_path.exists():
            if not create:
                raise FileNotFoundError(f"folder: no project in {folder}")
            folder.mkdir(parents=True, exist_ok=True)
        lock = _lock(folder / LOCK_NAME)
        conn = None
        try:
            _refuse_a_lost_database(db_path, folder / MEDIA_DIR)
            conn = sqlite3.connect(db_path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
            tables = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
            if tables and "schema_version" not in tables:
                raise ProjectError(
                    f"folder: {db_path} is another program's database (tables: "
                    f"{', '.join(tables[:5])}{' …' if len(tables) > 5 else ''}), not a "
                    f"project; choose another folder (nothing was written to it)")
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":
                log.warning("project %s: journal mode is %s, not WAL", folder, mode)
            conn.execute(f"PRAGMA synchronous={synchronous}")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            project = cls(folder, conn, lock)
            project._migrate()
            project._recover()
            project.document = project._load()
            project._unsubscribe = project.document.subscribe(project._save_changes)
        except sqlite3.DatabaseError as exc:  # not a database, or a damaged one
            if conn is not None:
                conn.close()
            _unlock(lock)
            raise ProjectError(f"folder: {db_path} is not a readable project database "
                               f"({exc}); restore it from a backup or open another "
                               f"folder") from None
        except BaseException:
            if conn is not None:
                conn.close()
            _unlock(lock)
            raise
        return project

    def close(self) -> None:
        """Stops saving, closes the database and releases the lock (idempotent)."""
        if self._conn is None:
            return
        self._unsubscribe()
        if self._unsaved:
            try:
                self.save_pending()
            except Exception:
                log.exception("project %s: %d change(s) could not be saved at close",
                              self.folder, len(self._unsaved))
        try:
            self._conn.execute("PRAGMA optimize")
        except sqlite3.Error:
            log.exception("project %s: PRAGMA optimize failed", self.folder)
        self._conn.close()
        self._conn = None  # type: ignore[assignment]
        _unlock(self._lock)
        self._lock = None

    def __enter__(self) -> Project:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- database ---------------------------------------------------------------------------
    @property
    def connection(self) -> sqlite3.Connection:
        """The one connection (for queries; write through :meth:`transaction`)."""
        if self._conn is None:
            raise ProjectError("the project is closed")
        return self._conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``with project.transaction() as conn:`` all or nothing; nests with savepoints.

        The outermost level is ``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on any
        exception, including a failed commit, e.g. a deferred foreign key). The exception
        raised is the one that stopped the transaction: SQLite rolls back by itself on some
        errors (a full disk), and the ``ROLLBACK`` that then fails is only logged.
        """
        conn = self.connection
        if self._depth == 0:
            conn.execute("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                self._unsaved_written = False  # first: the pending changes stay pending
                _rollback(conn, "ROLLBACK")
                raise
            finally:
                self._depth = 0
            if self._unsaved_written:  # every pending change is in the file now
                self._unsaved.clear()
                self._unsaved_written = False
        else:
            name = f"sp{self._depth}"
            conn.execute(f"SAVEPOINT {name}")
            self._depth += 1
            try:
                yield conn
            except BaseException:
                _rollback(conn, f"ROLLBACK TO {name}", f"RELEASE {name}")
                raise
            else:
                conn.execute(f"RELEASE {name}")
            finally:
                self._depth -= 1

    @property
    def schema_version(self) -> int:
        """Id of the last migration applied."""
        row = self.connection.execute("SELECT MAX(id) FROM schema_version").fetchone()
        return int(row[0] or 0)

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check`` result: "ok", or its findings joined by lines."""
        rows = self.connection.execute("PRAGMA integrity_check").fetchall()
        return "\n".join(str(r[0]) for r in rows)

    def _migrate(self) -> None:
        conn = self.connection
        with self.transaction():
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version"
                " (id INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            applied = dict(conn.execute("SELECT id, name FROM schema_version").fetchall())
        known = {m.id: m.name for m in MIGRATIONS}
        newer = sorted(set(applied) - set(known))
        if newer:
            raise ProjectError(
                f"This project was saved by a newer version of the studio (schema {newer[-1]});"
                " update the studio to open it."
            )
        for mid, name in applied.items():
            if known[mid] != name:
                raise ProjectError(
                    f"schema_version: migration {mid} is {name!r}, expected "
                    f"{known[mid]!r}; this project's schema is unknown"
                )
        for m in MIGRATIONS:
            if m.id in applied:
                continue
            with self.transaction():
                for statement in m.statements:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_version (id, name, applied_at) VALUES (?, ?, ?)",
                    (m.id, m.name, time.time()),
                )
            log.info("project %s: applied migration %d %s", self.folder, m.id, m.name)

    def _recover(self) -> None:
        conn = self.connection
        with self.transaction():
            self.recovered = [
                r[0] for r in conn.execute("SELECT id FROM variants WHERE status = 'running'")
            ]
            conn.execute(
                "UPDATE variants SET status = 'interrupted', error = ? WHERE status = 'running'",
                (INTERRUPTED_MESSAGE,),
            )
            conn.execute(
                "DELETE FROM queue WHERE variant_id IN"
                " (SELECT id FROM variants WHERE status NOT IN ('queued', 'running'))"
            )
        if self.recovered:
            log.warning("project %s: %d interrupted variants", self.folder, len(self.recovered))

    def _load(self) -> Document:
        conn = self.connection
        artifacts: dict[str, list[Artifact]] = {}
        for vid, media_id, kind in conn.execute(
            "SELECT variant_id, media_id, kind FROM artifacts ORDER BY variant_id, position"
        ):
            artifacts.setdefault(vid, []).append(Artifact(media_id, kind))
        variants = [
            Variant(
                id=r[0],
                parent_id=r[1],
                request_json=r[2],
                request_id=r[3],
                status=Status(r[4]),
                name=r[5],
                starred=bool(r[6]),
                error=r[7],
                artifacts=tuple(artifacts.get(r[0], ())),
                created_at=r[8],
            )
            for r in conn.execute(
                "SELECT id, parent_id, request_json, request_id, status, name, starred, error,"
                " created_at FROM variants ORDER BY created_at, id"
            )
        ]
        shots = [
            Shot(id=r[0], variant_id=r[1], in_frame=r[2], out_frame=r[3], duration_s=r[4])
            for r in conn.execute(
                "SELECT id, variant_id, in_frame, out_frame, duration_s FROM shots"
                " ORDER BY position"
            )
        ]
        queue = [r[0] for r in conn.execute("SELECT variant_id FROM queue ORDER BY position")]
        doc = Document.restore(variants, shots, queue)
        if list(doc.queue()) != queue:  # restore repaired it: save the repair
            with self.transaction():
                conn.execute("DELETE FROM queue")
                conn.executemany(
                    "INSERT INTO queue (variant_id, position) VALUES (?, ?)",
                    [(vid, i) for i, vid in enumerate(doc.queue())],
                )
        return doc

    # -- saving document changes ------------------------------------------------------------
    @property
    def unsaved_changes(self) -> int:
        """How many document changes are not in the file yet (0 after every good save)."""
        return len(self._unsaved)

    def save_pending(self) -> None:
        """Saves the changes a failed save left behind (nothing when there are none).

        Raises:
            sqlite3.Error: the save failed again (the changes stay pending).
        """
        if self._unsaved:
            self._apply(())
        self._saved_again()

    @contextmanager
    def save_errors_raised(self) -> Iterator[None]:
        """Inside, a failed save of the document's changes is raised to the code that
        changed the document, even with :attr:`on_save_state` set: for a change that must
        not stand unsaved (a result's finish, which then stays pending)."""
        self._raising += 1
        try:
            yield
        finally:
            self._raising -= 1

    def _save_changes(self, events: Sequence[ChangeEvent]) -> None:
        """The document's listener: saves ``events`` (see :meth:`_apply`). A failure (disk
        full, I/O error, a read-only disk) goes to :attr:`on_save_state` when set, with the
        number of changes kept pending, and is raised otherwise (and inside
        :meth:`save_errors_raised`); the first good save after a failure is told too."""
        try:
            self._apply(events)
        except (sqlite3.Error, OSError) as exc:
            self._save_failing = True
            if self.on_save_state is None or self._raising:
                raise
            log.error("project %s: saving %d change(s) failed: %s", self.folder,
                      len(self._unsaved), exc)
            self.on_save_state(exc, len(self._unsaved))
            return
        if not self._unsaved:
            self._saved_again()

    def _saved_again(self) -> None:
        """After a good save: tells :attr:`on_save_state` once that a failing save caught up."""
        if self._save_failing:
            self._save_failing = False
            if self.on_save_state is not None:
                self.on_save_state(None, 0)

    def _apply(self, events: Sequence[ChangeEvent]) -> None:
        """Saves the changes ``events`` name, after any a failed save left pending (each
        save writes an entity's current state, so saving one again is harmless); one
        transaction, and on failure all of them stay pending for the next save."""
        doc = self.document
        self._unsaved.extend(e for e in events if e.kind in _SAVED_KINDS)
        self._unsaved_written = False
        with self.transaction():
            timeline = queue = False
            for event in list(self._unsaved):
                if event.kind in (VARIANTS_ADDED, VARIANTS_CHANGED, VARIANTS_REMOVED):
                    for vid in event.ids:
                        self._save_variant(vid)
                elif event.kind in (SHOTS_ADDED, SHOTS_CHANGED, SHOTS_REMOVED, SHOTS_MOVED):
                    for sid in event.ids:
                        self._save_shot(sid)
                    timeline = timeline or event.kind != SHOTS_CHANGED
                elif event.kind == QUEUE_CHANGED:
                    queue = True
            if timeline:
                self.connection.executemany(
                    "UPDATE shots SET position = ? WHERE id = ?",
                    [(i, s.id) for i, s in enumerate(doc.shots())],
                )
            if queue:
                self.connection.execute("DELETE FROM queue")
                self.connection.executemany(
                    "INSERT INTO queue (variant_id, position) VALUES (?, ?)",
                    [(vid, i) for i, vid in enumerate(doc.queue())],
                )
            self._unsaved_written = True

    def _save_variant(self, variant_id: str) -> None:
        conn = self.connection
        if not self.document.has_variant(variant_id):
            conn.execute("DELETE FROM variants WHERE id = ?", (variant_id,))
            return
        v = self.document.variant(variant_id)
        conn.execute(
            "INSERT INTO variants (id, parent_id, request_json, request_id, status, name,"
            " starred, error, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET parent_id = excluded.parent_id,"
            " request_json = excluded.request_json, request_id = excluded.request_id,"
            " status = excluded.status, name = excluded.name, starred = excluded.starred,"
            " error = excluded.error, created_at = excluded.created_at",
            (
                v.id,
                v.parent_id,
                v.request_json,
                v.request_id,
                v.status.value,
                v.name,
                int(v.starred),
                v.error,
                v.created_at,
            ),
        )
        conn.execute("DELETE FROM artifacts WHERE variant_id = ?", (v.id,))
        conn.executemany(
            "INSERT INTO artifacts (variant_id, position, media_id, kind) VALUES (?, ?, ?, ?)",
            [(v.id, i, a.media_id, a.kind) for i, a in enumerate(v.artifacts)],
        )

    def _save_shot(self, shot_id: str) -> None:
        conn = self.connection
        try:
            index = self.document.shot_index(shot_id)
        except KeyError:
            conn.execute("DELETE FROM shots WHERE id = ?", (shot_id,))
            return
        s = self.document.shots()[index]
        conn.execute(
            "INSERT INTO shots (id, position, variant_id, in_frame, out_frame, duration_s)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
            " position = excluded.position, variant_id = excluded.variant_id,"
            " in_frame = excluded.in_frame, out_frame = excluded.out_frame,"
            " duration_s = excluded.duration_s",
            (s.id, index, s.variant_id, s.in_frame, s.out_frame, s.duration_s),
        )

    # -- media lifetime ---------------------------------------------------------------------
    def referenced_media(self) -> set[str]:
        """Media ids the saved project refers to: artifacts and every string in requests
        and in the saved draft (its inputs and mask)."""
        conn = self.connection
        out = {r[0] for r in conn.execute("SELECT media_id FROM artifacts")}
        for (request_json,) in conn.execute("SELECT request_json FROM variants"):
            out |= json_strings(request_json)
        for (state_json,) in conn.execute("SELECT state_json FROM draft"):
            try:
                out |= json_strings(state_json)
            except ValueError:  # a damaged draft keeps nothing alive; it is not restored
                pass
        return out

    # -- the draft ---------------------------------------------------------------------------
    def save_draft(self, state: dict[str, Any]) -> None:
        """Saves the settings panel's unsent request (any JSON-able dict; one row, replaced
        atomically), so a crash or a close keeps what the user was typing.

        Raises:
            ValueError: ``state`` is not JSON-able.
            sqlite3.Error / OSError: the write failed (the previous draft stays).
        """
        try:
            text = json.dumps(state, sort_keys=True, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"draft: not JSON-able ({exc})") from None
        with self.transaction() as conn:
            conn.execute("INSERT OR REPLACE INTO draft (id, state_json, saved_at) "
                         "VALUES (1, ?, ?)", (text, time.time()))

    def load_draft(self) -> dict[str, Any] | None:
        """The draft saved by :meth:`save_draft`; None when there is none or it is not a
        JSON object (a damaged row is logged and ignored: the draft is a convenience)."""
        row = self.connection.execute("SELECT state_json FROM draft WHERE id = 1").fetchone()
        if row is None:
            return None
        try:
            state = json.loads(row[0])
        except ValueError:
            log.warning("project %s: the saved draft is not JSON; ignored", self.folder)
            return None
        return state if isinstance(state, dict) else None

    def collect_garbage(
        self, keep: Iterable[str] = frozenset(), *, orphan_grace_s: float = 3600.0
    ) -> list[str]:
        """Deletes media that nothing refers to; returns the ids deleted.

        Kept: ``keep``, artifacts of saved variants, ids (file or pixels ids) named anywhere
        in a saved request, and whatever this document's undo history could bring back. See
        :meth:`MediaStore.sweep_garbage` for the orphan-file rule. The studio runs the two
        halves apart: :meth:`mark_garbage` on its thread, the sweep on a worker thread.
        """
        return self.media.sweep_garbage(self.mark_garbage(keep), orphan_grace_s=orphan_grace_s)

    def mark_garbage(
        self, keep: Iterable[str] = frozenset(), *, include_history: bool = True
    ) -> GarbagePlan:
        """The database half of :meth:`collect_garbage` (on the project's thread): forgets the
        unreferenced media and returns the plan for :meth:`MediaStore.sweep_garbage`.

        Args:
            include_history: keep what the undo history could bring back (False when the
                history is going away, e.g. the studio window is closing).
        """
        live = set(keep) | self.referenced_media() | self.document.media_in_use()
        if include_history:
            live |= self.document.history.held_media()
        return self.media.mark_garbage(live)


def _lock(path: Path) -> Any:
    f = open(path, "a+b")  # held open for the project's lifetime
    if fcntl is not None:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise ProjectLockedError(
                f"The project {path.parent} is open in another studio window."
            ) from None
    return f


def _unlock(lock: Any) -> None:
    if lock is not None:
        lock.close()  # closing the descriptor releases the flock
