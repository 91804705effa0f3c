"""The variant tree: a Qt item model over the document's variants, and its panel.

:class:`VariantTreeModel` mirrors the document's tree (parent -> ordered children) and turns
each document change event into the matching row signals: removals (children before parents;
a subtree goes with its root), insertions (parents first, at the position the document orders
siblings by: creation time, then id) and data changes. Columns: the variant (thumbnail and
name; editable = rename), its status (with progress while running), its star (checkable).
The tooltip of a variant says what changed against its parent (:func:`diff_requests`).
Renames and stars made through the model are undoable commands.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import (
    QAbstractItemModel,
    QMimeData,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    QSize,
    Qt,
    Signal,
)
from PySide6.QtGui import QBrush, QColor, QIcon, QPixmap
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QToolButton,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from studio.core.commands import RenameVariant, StarVariant, clean_variant_name
from studio.core.document import (
    PENDING,
    VARIANTS_ADDED,
    VARIANTS_CHANGED,
    VARIANTS_REMOVED,
    ChangeEvent,
    Document,
    Status,
    Variant,
)
from studio.ui.background import to_qimage
from studio.ui.controller import StudioController, describe
from studio.ui.media_cache import MediaCache

VariantIdRole = Qt.ItemDataRole.UserRole + 1
COLUMNS = ("Variant", "Status", "★")
#: drag data of variants (a JSON list of ids), dropped on the timeline as shots
VARIANTS_MIME = "application/x-diffusion-studio-variants"
STATUS_COLORS = {
    Status.FAILED: QColor(224, 88, 79),
    Status.CANCELLED: QColor(150, 150, 150),
    Status.INTERRUPTED: QColor(230, 160, 60),
    Status.RUNNING: QColor(90, 160, 230),
}
ICON_SIZE = 40


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def variant_label(variant: Variant) -> str:
    """The name shown for a variant: its name, else a summary of its request."""
    if variant.name:
        return variant.name
    try:
        request = variant.request
    except ValueError:
        return variant.id[:8]
    prompt = _short(request.get("prompt", ""), 32)
    return f"{prompt or request.get('mode')} · seed {request.get('seed')}"


def diff_tooltip(document: Document, variant_id: str) -> str:
    """What changed against the parent (or a summary for a root), for tooltips."""
    v = document.variant(variant_id)
    lines = [variant_label(v)]
    try:
        lines.append(describe(v.request))
    except ValueError:
        pass
    if v.parent_id is None:
        lines.append("Root variant (no parent)")
    else:
        diff = document.request_diff(variant_id)
        parent = document.variant(v.parent_id)
        lines.append(f"Changes from {variant_label(parent)}:")
        if not diff:
            lines.append("  none (a reproduction)")
        for field, old, new in diff:
            lines.append(f"  {field}: {_short(old)} → {_short(new)}")
    if v.error:
        lines.append(f"{v.status}: {v.error}")
    return "\n".join(lines)


class _Node:
    __slots__ = ("children", "created", "parent", "vid")

    def __init__(self, vid: str | None, parent: _Node | None, created: tuple = ()) -> None:
        self.vid = vid
        self.parent = parent
        self.children: list[_Node] = []
        self.created = created


class VariantTreeModel(QAbstractItemModel):
    """The variant tree of a document (see the module docstring).

    Args:
        document: the document shown.
        media: thumbnails of results (optional).
        controller: progress and previews of running variants (optional).
    """

    def __init__(
        self, document: Document, media: MediaCache | None = None,
        controller: StudioController | None = None, parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._doc = document
        self._media = media
        self._controller = controller
        self._root = _Node(None, None)
        self._nodes: dict[str, _Node] = {}
        self._keep: list[_Node] = []  # index internal pointers must stay valid
        self._icons: dict[str, QIcon] = {}
        for vid in document.roots():
            self._root.children.append(self._build(vid, self._root))
        self._unsubscribe = document.subscribe(self._on_changes)
        if media is not None:
            media.thumbnailReady.connect(self._on_thumbnail)
        if controller is not None:
            controller.previewReady.connect(lambda vid: self._refresh(vid, (0,)))
            controller.progressChanged.connect(lambda vid: self._refresh(vid, (1,)))

    def detach(self) -> None:
        """Stops following the document (before the document goes away)."""
        self._unsubscribe()

    # -- mirror -----------------------------------------------------------------------------
    def _build(self, vid: str, parent: _Node) -> _Node:
        v = self._doc.variant(vid)
        node = _Node(vid, parent, (v.created_at, v.id))
        self._nodes[vid] = node
        self._keep.append(node)
        for child in self._doc.children(vid):
            if child not in self._nodes:
                node.children.append(self._build(child, node))
        return node

    def _index_of(self, node: _Node, column: int = 0) -> QModelIndex:
        if node is self._root or node.parent is None:
            return QModelIndex()
        return self.createIndex(node.parent.children.index(node), column, node)

    def _forget(self, node: _Node) -> None:
        self._nodes.pop(node.vid, None)
        for child in node.children:
            self._forget(child)

    def _on_changes(self, events: Sequence[ChangeEvent]) -> None:
        for event in events:
            if event.kind == VARIANTS_REMOVED:
                self._remove(event.ids)
            elif event.kind == VARIANTS_ADDED:
                self._add(event.ids)
            elif event.kind == VARIANTS_CHANGED:
                for vid in event.ids:
                    self._refresh(vid)

    def _remove(self, ids: Sequence[str]) -> None:
        removed = set(ids)
        for vid in ids:
            node = self._nodes.get(vid)
            if node is None:
                continue
            parent = node.parent
            if parent is not self._root and parent.vid in removed and parent.vid in self._nodes:
                continue  # goes with its parent
            row = parent.children.index(node)
            self.beginRemoveRows(self._index_of(parent), row, row)
            parent.children.pop(row)
            self._forget(node)
            self.endRemoveRows()

    def _add(self, ids: Sequence[str]) -> None:
        for vid in ids:
            if vid in self._nodes or not self._doc.has_variant(vid):
                continue
            v = self._doc.variant(vid)
            parent = self._root if v.parent_id is None else self._nodes.get(v.parent_id)
            if parent is None:  # should not happen (parents come first): rebuild
                self._reset()
                return
            keys = [c.created for c in parent.children]
            row = bisect.bisect_left(keys, (v.created_at, v.id))
            self.beginInsertRows(self._index_of(parent), row, row)
            parent.children.insert(row, self._build(vid, parent))
            self.endInsertRows()

    def _reset(self) -> None:
        self.beginResetModel()
        self._root = _Node(None, None)
        self._nodes.clear()
        for vid in self._doc.roots():
            self._root.children.append(self._build(vid, self._root))
        self.endResetModel()

    def _refresh(self, vid: str, columns: Sequence[int] = (0, 1, 2)) -> None:
        node = self._nodes.get(vid)
        if node is None:
            return
        first, last = self._index_of(node, min(columns)), self._index_of(node, max(columns))
        self.dataChanged.emit(first, last)

    def _on_thumbnail(self, media_id: str) -> None:
        for vid in self._nodes:
            v = self._doc.variant(vid) if self._doc.has_variant(vid) else None
            if v is not None and any(a.media_id == media_id for a in v.artifacts):
                self._refresh(vid, (0,))

    # -- lookups ----------------------------------------------------------------------------
    def index_for(self, variant_id: str, column: int = 0) -> QModelIndex:
        """The index of a variant (invalid when it is not shown)."""
        node = self._nodes.get(variant_id)
        return self._index_of(node, column) if node is not None else QModelIndex()

    def variant_id(self, index: QModelIndex | QPersistentModelIndex) -> str | None:
        """The variant of an index (None for an invalid index)."""
        if not index.isValid():
            return None
        node = index.internalPointer()
        return node.vid if isinstance(node, _Node) else None

    # -- QAbstractItemModel -----------------------------------------------------------------
    def index(self, row: int, column: int, parent: QModelIndex = QModelIndex()) -> QModelIndex:
        """Qt override."""
        node = parent.internalPointer() if parent.isValid() else self._root
        if not isinstance(node, _Node) or not (0 <= row < len(node.children)) \
                or not (0 <= column < len(COLUMNS)):
            return QModelIndex()
        return self.createIndex(row, column, node.children[row])

    def parent(self, index: QModelIndex | None = None) -> Any:  # type: ignore[override]
        """Qt override (with no argument: the QObject parent)."""
        if index is None:
            return QObject.parent(self)
        if not index.isValid():
            return QModelIndex()
        node = index.internalPointer()
        if not isinstance(node, _Node) or node.parent is None or node.parent is self._root:
            return QModelIndex()
        return self._index_of(node.parent)

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: N802
        """Qt override."""
        if parent.column() > 0:
            return 0
        node = parent.internalPointer() if parent.isValid() else self._root
        return len(node.children) if isinstance(node, _Node) else 0

    def columnCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: N802
        """Qt override."""
        return len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation,  # noqa: N802
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        """Qt override."""
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole \
                and 0 <= section < len(COLUMNS):
            return COLUMNS[section]
        return None

    def flags(self, index: QModelIndex) -> Qt.ItemFlag:
        """Qt override: names are editable, stars checkable; rows drag (to the timeline)."""
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        flags = (Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
                 | Qt.ItemFlag.ItemIsDragEnabled)
        if index.column() == 0:
            flags |= Qt.ItemFlag.ItemIsEditable
        elif index.column() == 2:
            flags |= Qt.ItemFlag.ItemIsUserCheckable
        return flags

    def mimeTypes(self) -> list[str]:  # noqa: N802
        """Qt override."""
        return [VARIANTS_MIME]

    def mimeData(self, indexes: Sequence[QModelIndex]) -> QMimeData:  # noqa: N802
        """Qt override: the dragged variants' ids (a JSON list, in tree order), which the
        timeline takes as new shots."""
        ids = list(dict.fromkeys(v for v in (self.variant_id(i) for i in indexes) if v))
        data = QMimeData()
        data.setData(VARIANTS_MIME, json.dumps(ids).encode())
        return data

    def supportedDragActions(self) -> Qt.DropAction:  # noqa: N802
        """Qt override: a drag copies (the variant stays in the tree)."""
        return Qt.DropAction.CopyAction

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        """Qt override."""
        vid = self.variant_id(index)
        if vid is None or not self._doc.has_variant(vid):
            return None
        v = self._doc.variant(vid)
        col = index.column()
        if role == VariantIdRole:
            return vid
        if role == Qt.ItemDataRole.ToolTipRole:
            return diff_tooltip(self._doc, vid)
        if col == 0:
            if role == Qt.ItemDataRole.DisplayRole:
                return variant_label(v)
            if role == Qt.ItemDataRole.EditRole:
                return v.name
            if role == Qt.ItemDataRole.DecorationRole:
                return self._icon(v)
        elif col == 1:
            if role == Qt.ItemDataRole.DisplayRole:
                progress = self._controller.progress(vid) if self._controller else None
                if v.status == Status.RUNNING and progress is not None:
                    return f"running {round(progress.fraction * 100)}%"
                return str(v.status)
            if role == Qt.ItemDataRole.ForegroundRole and v.status in STATUS_COLORS:
                return QBrush(STATUS_COLORS[v.status])
        elif col == 2:
            if role == Qt.ItemDataRole.CheckStateRole:
                return Qt.CheckState.Checked if v.starred else Qt.CheckState.Unchecked
        return None

    def _icon(self, v: Variant) -> QIcon | None:
        if v.status in PENDING and self._controller is not None:
            preview = self._controller.preview(v.id)
            if preview is not None:
                return QIcon(QPixmap.fromImage(to_qimage(preview)))
            return None
        if not v.artifacts or self._media is None:
            return None
        mid = v.artifacts[0].media_id
        icon = self._icons.get(mid)
        if icon is None:
            image = self._media.thumbnail(mid)
            if image is None:
                return None
            icon = self._icons[mid] = QIcon(QPixmap.fromImage(image))
        return icon

    def setData(self, index: QModelIndex, value: Any,  # noqa: N802
                role: int = Qt.ItemDataRole.EditRole) -> bool:
        """Qt override: renaming and starring push undoable commands."""
        vid = self.variant_id(index)
        if vid is None or not self._doc.has_variant(vid):
            return False
        v = self._doc.variant(vid)
        if index.column() == 0 and role == Qt.ItemDataRole.EditRole:
            name = clean_variant_name(str(value))
            if name != v.name:
                self._doc.history.push(RenameVariant(vid, name))
            return True
        if index.column() == 2 and role == Qt.ItemDataRole.CheckStateRole:
            starred = Qt.CheckState(value) == Qt.CheckState.Checked
            if starred != v.starred:
                self._doc.history.push(StarVariant(vid, starred))
            return True
        return False


class VariantPanel(QWidget):
    """The tree view of variants with a small toolbar.

    Signals:
        currentChanged(str): the current variant ("" when none).
        selectionChanged(list): the selected variant ids.
    """

    currentChanged = Signal(str)
    selectionChanged = Signal(list)

    def __init__(self, model: VariantTreeModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self.view = QTreeView()
        # siblings differ at the end of their labels ("… · seed 12"): elide the middle
        self.view.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.view.setModel(model)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.view.setDragEnabled(True)  # onto the timeline
        self.view.setDragDropMode(QAbstractItemView.DragDropMode.DragOnly)
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.EditKeyPressed
                                  | QAbstractItemView.EditTrigger.SelectedClicked)
        self.view.setIconSize(QSize(ICON_SIZE, ICON_SIZE))
        self.view.setUniformRowHeights(False)
        self.view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        header = self.view.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)
        self.toolbar = QHBoxLayout()
        self.toolbar.setContentsMargins(0, 0, 0, 0)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addLayout(self.toolbar)
        layout.addWidget(self.view, 1)
        self.view.selectionModel().currentChanged.connect(self._on_current)
        self.view.selectionModel().selectionChanged.connect(
            lambda *_: self.selectionChanged.emit(self.selected()))
        model.rowsInserted.connect(self._on_rows_inserted)

    def add_tool(self, action: Any) -> QToolButton:
        """Adds a button for a QAction to the toolbar."""
        button = QToolButton()
        button.setDefaultAction(action)
        self.toolbar.addWidget(button)
        return button

    def _on_rows_inserted(self, parent: QModelIndex, first: int, last: int) -> None:
        if parent.isValid():
            self.view.expand(parent)

    def _on_current(self, current: QModelIndex, previous: QModelIndex) -> None:
        self.currentChanged.emit(self.model.variant_id(current) or "")

    def current(self) -> str | None:
        """The current variant id."""
        return self.model.variant_id(self.view.currentIndex())

    def selected(self) -> list[str]:
        """The selected variant ids, in tree order."""
        rows = self.view.selectionModel().selectedRows(0)
        ids = [self.model.variant_id(i) for i in rows]
        order = {vid: n for n, vid in enumerate(self._tree_order())}
        return sorted((i for i in ids if i), key=lambda vid: order.get(vid, 1 << 30))

    def _tree_order(self) -> list[str]:
        return [v.id for v in self.model._doc.variants()]

    def select(self, variant_ids: Sequence[str], current: str | None = None) -> None:
        """Selects variants (the first, or ``current``, becomes current)."""
        from PySide6.QtCore import QItemSelection, QItemSelectionModel

        sel = QItemSelection()
        for vid in variant_ids:
            index = self.model.index_for(vid)
            if index.isValid():
                sel.select(index, self.model.index_for(vid, len(COLUMNS) - 1))
                self.view.scrollTo(index)
        flags = QItemSelectionModel.SelectionFlag.ClearAndSelect
        self.view.selectionModel().select(sel, flags)
        target = current or (variant_ids[0] if variant_ids else None)
        if target:
            self.view.selectionModel().setCurrentIndex(
                self.model.index_for(target), QItemSelectionModel.SelectionFlag.NoUpdate)
