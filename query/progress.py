"""Progress bars for the commands that take a while (catch-up, bulk load, verify, migrate --copy,
scan --out): a tqdm bar on stderr when tqdm is installed and stderr is a terminal, else nothing.

tqdm is an optional extra (``ebb[progress]``) and is imported only when a bar is drawn, so the
commands that answer at once (``probe``, ``stats``) never load it. ``plural`` keeps counts right
("1 tick", "2 ticks") in the lines those commands print.
"""

from __future__ import annotations

import re
import sys
from typing import Callable

# storage's progress messages end their step with "(k/N ...)", e.g. "I3: rebuilt (2/9)"
_STEP = re.compile(r"\((\d+)/(\d+)\b")


def plural(n: int, word: str, many: str | None = None) -> str:
    """``n word`` with the word's plural unless n is 1: ``plural(1, "tick")`` is ``1 tick``."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def human_size(n: float) -> str:
    """Bytes for people: ``512 B``, ``1.5 KiB``, ``3.2 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.0f}"


class Bar:
    """A progress bar, or nothing where one cannot be shown. ``update`` adds done work; ``set``
    sets it (and the total, once known); ``write`` prints a line above the bar (or alone)."""

    def __init__(self, desc: str, total: int | None = None, unit: str = "it", enabled: bool = True):
        self._bar = None
        if enabled and sys.stderr.isatty():
            try:
                from tqdm import tqdm
            except ImportError:  # an optional extra: no bar, same output otherwise
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", leave=False,
                                 file=sys.stderr, dynamic_ncols=True)

    @property
    def shown(self) -> bool:
        return self._bar is not None

    def update(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def set(self, done: int | None, total: int | None = None, note: str | None = None) -> None:
        """Done work (None: unchanged), the total if given, and a note after the bar."""
        if self._bar is None:
            return
        if total is not None and self._bar.total != total:
            self._bar.total = total
        if done is not None:
            self._bar.n = done
        if note is not None:
            self._bar.set_postfix_str(note, refresh=False)
        self._bar.refresh()

    def write(self, line: str) -> None:
        """``line`` on stderr, above the bar if there is one."""
        if self._bar is not None:
            self._bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Bar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def message_bar(desc: str, quiet: bool = False) -> tuple[Bar, Callable[[str], None] | None]:
    """A bar fed by storage's progress messages (``Archive.load``, ``migrate``): with a bar, each
    message moves it to its "(k/N" step; without one, each message is printed as a line on stderr,
    as before bars existed (nothing with ``quiet``)."""
    bar = Bar(desc, enabled=not quiet)
    if quiet:
        return bar, None

    def progress(msg: str) -> None:
        if not bar.shown:
            print(f"  {msg}", file=sys.stderr, flush=True)
            return
        m = _STEP.search(msg)
        if m:
            bar.set(int(m.group(1)), int(m.group(2)), msg[:m.start()].strip())
        else:
            bar.set(None, note=msg)

    return bar, progress
