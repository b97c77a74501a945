"""The CLI's last line starts a line of its own.

A progress bar redraws its line with ``\\r`` and ends no line; a stage that fails while one is open (a full disk
during a chunked write) left ``error: ...`` glued to the bar's remnant, where neither a person nor ``grep
'^error:'`` finds it. ``main`` tracks whether stderr's last output ended a line (``track_stderr``) and, before its
one line, clears the bars still open and ends the line it is on (``start_line``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from storage.progress import close_all


class LineTracker:
    """``stream``, remembering whether the last text written to it ended a line (on a terminal ``\\r`` does too:
    the cursor is back at column 0, over a line a closed bar has blanked)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        try:
            self._tty = stream.isatty()
        except (AttributeError, ValueError):   # a closed or odd stream: treat it as a file
            self._tty = False
        self.at_line_start = True

    def write(self, text: str) -> int:
        if text:   # click probes with b"" and "" to learn what kind of stream this is
            self.at_line_start = text.endswith("\n") or (self._tty and text.endswith("\r"))
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:   # flush, fileno, isatty, encoding, buffer ...: the stream's own
        return getattr(self._stream, name)


@contextmanager
def track_stderr() -> Iterator[None]:
    """``sys.stderr`` is a ``LineTracker`` inside the block: everything created inside writes through it (tqdm
    bars, Prefect's console handlers, click), then the stream is put back."""
    before = sys.stderr
    sys.stderr = LineTracker(before)
    try:
        yield
    finally:
        sys.stderr = before


def start_line() -> None:
    """Clear the progress bars a failed command left open, and end stderr's current line unless it is ended."""
    close_all()
    stream = sys.stderr
    if isinstance(stream, LineTracker) and not stream.at_line_start:
        stream.write("\n")
        stream.flush()
