"""Persistence: a project folder holding ``project.sqlite`` and content-addressed media.

No Qt, no torch. See :mod:`studio.store.project` and :mod:`studio.store.media`.
"""

from studio.store.media import MediaStore, StagedMedia, media_id_of
from studio.store.project import (
    MIGRATIONS,
    Migration,
    Project,
    ProjectError,
    ProjectLockedError,
)

__all__ = [
    "MIGRATIONS",
    "MediaStore",
    "StagedMedia",
    "Migration",
    "Project",
    "ProjectError",
    "ProjectLockedError",
    "media_id_of",
]
