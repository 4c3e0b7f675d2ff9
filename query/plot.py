"""``ebb stats --plot``: a picture of the archive, drawn from ``Archive.outlook``'s data.

Three panels: the sub-index grid (rows: insertion partitions, columns: expiration partitions;
each cell's records and bytes, shaded by bytes), the bytes that expire at each coming update
(bars; draining runs stacked on top), and the next updates' cells (one small grid per update,
marking the sub-indices it inserts into, deletes from, or both). It draws exactly what
``ebb stats --format json`` prints under ``grid``, ``expiry_timeline`` and ``next_updates``.

matplotlib is an optional extra (``pip install 'ebb[plot]'``), imported only here.
"""

from __future__ import annotations

from typing import Callable

from ..storage.errors import UsageError
from .progress import human_size as _size

INSTALL_HINT = "ebb stats --plot needs matplotlib, an optional extra: pip install 'ebb[plot]' (or pip install matplotlib)"
_INSERT, _DELETE, _BOTH, _IDLE = "#4c72b0", "#dd8452", "#8172b3", "#eeeeee"


def draw(stats: dict, path: str, stamp: Callable[[int], str] | None = None) -> None:
    """Writes the picture of ``stats`` (``Archive.stats(next_updates=N)``) to ``path`` (PNG, or
    any format matplotlib infers from the name). ``stamp`` labels update times (default ``T=t``)."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError(INSTALL_HINT) from None
    matplotlib.use("Agg")  # files only: no display needed, and none is opened
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    label = stamp or (lambda t: f"T={t}")
    grid, timeline, plan = stats["grid"], stats["expiry_timeline"], stats["next_updates"]
    rows, cols = grid["rows"], grid["columns"]
    fig = plt.figure(figsize=(11, 6.6), dpi=80)
    gs = fig.add_gridspec(2, max(len(plan), 1), height_ratios=[1.25, 1], hspace=0.7, wspace=0.25)
    top = gs[0, :].subgridspec(1, 2, width_ratios=[1, 1.6], wspace=0.25)

    ax = fig.add_subplot(top[0, 0])
    values = [[cell["bytes"] for cell in row] for row in grid["cells"]]
    ax.imshow(values, cmap="Blues", vmin=0, vmax=max(1, max(max(r) for r in values)) * 1.4, aspect="auto")
    for r, row in enumerate(grid["cells"]):
        for c, cell in enumerate(row):
            ax.text(c, r, f"I{cell['subindex']}\n{cell['records']} rec\n{_size(cell['bytes'])}", ha="center",
                    va="center", fontsize=8)
    ax.set_xticks(range(cols), [f"E{c + 1}" for c in range(cols)] if rows > 1 else [f"I{c + 1}" for c in range(cols)])
    ax.set_yticks(range(rows), [f"G{r + 1}" for r in range(rows)] if rows > 1 else [""])
    ax.set_xlabel("expiration partition" if rows > 1 else "sub-index")
    if rows > 1:
        ax.set_ylabel("insertion partition")
    ax.set_title(f"{stats['layout']}, {stats['config']['mode']}\n{stats['records']} records, {_size(stats['bytes'])}",
                 fontsize=9)

    ax = fig.add_subplot(top[0, 1])
    if timeline:
        x = [e["slot"] for e in timeline]
        live = [e["bytes"] / 1024 for e in timeline]
        ax.bar(x, live, color=_DELETE, label="stored records")
        drain = [e["draining_bytes"] / 1024 for e in timeline]
        if any(drain):
            ax.bar(x, drain, bottom=live, color="#999999", label="draining layout's runs")
            ax.legend(fontsize=8)
        step = max(1, len(x) // 12)
        ax.set_xticks(x[::step], [str(s) for s in x[::step]], fontsize=7)
        ax.set_xlabel(f"update slot (slot {x[0]} at {label(timeline[0]['time'])}, "
                      f"then one every Delta = {stats['config']['delta']})", fontsize=8)
    else:
        ax.text(0.5, 0.5, "nothing stored expires", ha="center", va="center", transform=ax.transAxes)
    note = "\n(estimated: a Rebuild block's bytes spread over its exp range)" if stats.get("estimated") else ""
    ax.set_title("KiB that expire at each coming update" + note, fontsize=9)

    for k, upd in enumerate(plan):
        ax = fig.add_subplot(gs[1, k])
        ins, dele = set(upd["insert_into"]), set(upd["delete_from"])
        colours = [[_BOTH if i in ins and i in dele else _INSERT if i in ins else _DELETE if i in dele else _IDLE
                    for i in (r * cols + c + 1 for c in range(cols))] for r in range(rows)]
        for r in range(rows):
            for c in range(cols):
                ax.add_patch(matplotlib.patches.Rectangle((c, rows - 1 - r), 0.92, 0.92, color=colours[r][c]))
                ax.text(c + 0.46, rows - 1 - r + 0.46, f"I{r * cols + c + 1}", ha="center", va="center", fontsize=7)
        ax.set_xlim(0, cols)
        ax.set_ylim(0, rows)
        ax.set_aspect("equal")
        ax.axis("off")
        touched = len(ins | dele)
        ax.set_title(f"slot {upd['slot']} ({upd['kind']})\n{label(upd['time'])}\ntouches {touched}/{rows * cols}",
                     fontsize=8)
    fig.legend(handles=[Patch(color=_INSERT, label="inserts into"), Patch(color=_DELETE, label="deletes from"),
                        Patch(color=_BOTH, label="both")], loc="lower center", ncol=3, fontsize=8, frameon=False)
    last = "" if stats["last_update_time"] is None else f", the last at {label(stats['last_update_time'])}"
    fig.suptitle(f"{stats['path']}: {stats['updates']} update{'' if stats['updates'] == 1 else 's'}{last}", fontsize=10)
    fig.savefig(path)
    plt.close(fig)
