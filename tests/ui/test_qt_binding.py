"""The Qt binding itself: what the studio needs of PySide6 beyond its API."""

from __future__ import annotations

import sys

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QLabel, QPlainTextEdit


class _Emitter(QObject):
    changed = Signal()
    progress = Signal(object)


def test_qt_calls_keep_the_reference_counts_of_true_and_none(qapp):
    """PySide6 6.12.0 on Python 3.11 dropped one reference to ``True`` at each
    ``Signal.emit()`` and one to ``None`` at each Qt call returning nothing: after a few
    thousand signals or keystrokes the interpreter aborted ("Fatal Python error:
    none_dealloc"), and the studio vanished mid-session. pyproject.toml excludes that
    release; this catches a binding that does it again. (From Python 3.12 both objects are
    immortal and the counts never move.)"""
    emitter, label, edit = _Emitter(), QLabel(), QPlainTextEdit()
    received = []
    emitter.progress.connect(received.append)
    calls = (emitter.changed.emit, lambda: emitter.progress.emit(3),
             lambda: label.setText("a"), lambda: label.setVisible(False),
             lambda: edit.insertPlainText("x"))
    for call in calls:
        call()  # first calls may cache things
    before = sys.getrefcount(True), sys.getrefcount(None)
    for _ in range(200):
        for call in calls:
            call()
    after = sys.getrefcount(True), sys.getrefcount(None)
    assert len(received) == 201
    # a few references may come and go with caches; the bug lost 200 or more
    assert abs(after[0] - before[0]) < 20 and abs(after[1] - before[1]) < 20, \
        (f"PySide6 loses references: True {after[0] - before[0]:+d}, None "
         f"{after[1] - before[1]:+d} over 200 rounds of signals and Qt calls")
