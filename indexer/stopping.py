"""Clean stops of ``ebb run`` on SIGTERM (a supervisor's stop) or SIGINT (Ctrl-C).

``StopOnSignals`` turns the first of these signals into ``Stopped``, raised in the main thread
wherever it is, except inside ``deferred()``: there the signal is only noted, and ``check()``
raises it once the deferred work is done. The scheduler defers the writing and commit of a
tick's results, so a stop either abandons the tick before its commit (nothing of it is
committed; the next start runs it again, and files it may have begun to write are removed by
recovery, as after a crash) or lets the commit finish and stops after it. Further signals while
stopping are ignored, so that a second Ctrl-C cannot cut the clean-up short.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(BaseException):
    """A stop signal arrived. A BaseException, like KeyboardInterrupt, so that code catching
    Exception (ours, py4j's, Spark's) lets it through."""

    def __init__(self, signame: str):
        super().__init__(signame)
        self.signame = signame


class StopOnSignals:
    """Installs the handlers of SIGTERM and SIGINT for the life of a ``with`` block (main thread
    only) and puts the previous ones back after it."""

    def __init__(self) -> None:
        self.signame: str | None = None  # the signal that asked to stop, once one did
        self._deferring = 0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopOnSignals":
        for s in SIGNALS:
            self._previous[s] = signal.getsignal(s)
        self.install()
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def install(self) -> None:
        """(Re)installs the handlers: pyspark's SparkContext replaces the SIGINT one with its own
        (which raises KeyboardInterrupt whatever is under way), so the scheduler calls this again
        once Spark has started."""
        for s in SIGNALS:
            signal.signal(s, self._handle)

    def _handle(self, signum: int, frame) -> None:
        if self.signame is not None:
            return  # already stopping
        self.signame = signal.Signals(signum).name
        if not self._deferring:
            raise Stopped(self.signame)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """A stop signal inside this block waits for its end (then ``check`` raises it)."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1

    def ignore(self) -> None:
        """From now on a stop signal is only noted (the work it would stop is over)."""
        self._deferring += 1

    def check(self) -> None:
        """Raises ``Stopped`` if a signal arrived during a deferred block."""
        if self.signame is not None and not self._deferring:
            raise Stopped(self.signame)
