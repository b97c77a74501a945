"""Progress bars log to the run logger at a bounded rate."""

import logging

import pytest

from storage import progress as progress_mod


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def collected():
    logger, handler = logging.getLogger("gnnpipe"), Collect()
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler.lines
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def test_progress_logs_at_most_every_interval_and_at_the_end(monkeypatch, collected):
    clock = iter(float(t) for t in range(0, 1000))
    monkeypatch.setattr(progress_mod.time, "monotonic", lambda: next(clock))
    bar = progress_mod.progress(range(100), desc="work", log_every_s=30, mininterval=0, miniters=1,
                                disable=False)
    for _ in bar:
        pass
    lines = collected
    assert 2 <= len(lines) <= 6, lines           # ~1 per 30 ticks of the fake clock, plus the final line
    assert lines[-1].startswith("work: 100%")


def test_disabled_progress_is_silent(collected):
    for _ in progress_mod.progress(range(10), disable=True):
        pass
    assert collected == []
