"""The shared part of the studio's flat table models (queue, timeline): rows are ids in
``self._rows``, columns are the class's ``columns`` titles."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt


class RowsTableModel(QAbstractTableModel):
    """A flat table whose rows are ``self._rows`` and whose header is ``columns``."""

    columns: tuple[str, ...] = ()
    _rows: list[str]

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: N802
        """Qt override."""
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: N802
        """Qt override."""
        return 0 if parent.isValid() else len(self.columns)

    def headerData(self, section: int, orientation: Qt.Orientation,  # noqa: N802
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        """Qt override: column titles across, row numbers down."""
        if role != Qt.ItemDataRole.DisplayRole:
            return None
        if orientation == Qt.Orientation.Horizontal:
            return self.columns[section] if 0 <= section < len(self.columns) else None
        return section + 1
