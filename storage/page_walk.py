"""A check of an LMDB file's pages before LMDB walks them, so damage is an error, not an abort.

LMDB trusts its pages: a zeroed or garbled branch or leaf page makes it fail an assertion
(``mdb.c: Assertion 'IS_LEAF(mp)' failed``) and abort the whole process, or read outside the
page. ``check`` walks, read-only, every page a version's trees reach, from the
meta page that names the version, and checks what LMDB relies on: each page's number, kind and
bounds, each node's extent within its page, the depth of every leaf, and each large value's
overflow pages; it raises CorruptionError at the first page that fails. Pages are read through
one memory map of the file, kept from one version's check to the next, by ebb's native module
(storage/native/lmdb_pages.c), or without it whole levels at a time with numpy (a few MB of
metadata: a few milliseconds). The caller holds a read transaction on the version (``txn_id``), so its pages
stay as they are while they are checked, even while a writer commits.

What it cannot see is damage that leaves a page well-formed (a flipped bit in a key or value):
the seals of the values and the root (``manifest``) find that.
"""

from __future__ import annotations

import mmap
import os
from typing import Callable

import numpy as np

from .errors import CorruptionError

# LMDB's format (mdb.c), not ebb's: it holds for every LMDB file, whatever ebb's format version
_MAGIC = 0xBEEFC0DE
_PAGE_SIZES = (4096, 8192, 16384, 32768, 65536)  # the page sizes LMDB can have written; two meta pages lead the file
_HDR = 16  # page header: pgno (8), pad (2), flags (2), lower (2), upper (2)
_NODE = 8  # node header: lo, hi, flags, ksize (2 each)
_BRANCH, _LEAF, _OVERFLOW = 0x01, 0x02, 0x04
_BIGDATA = 0x01
_INVALID = (1 << 64) - 1


def check(path: str, txn_id: int, keep_map: bool = False) -> None:
    """Checks the pages of version ``txn_id`` of the LMDB file ``path`` (held by the caller's
    read transaction); CorruptionError naming the first bad page. Natively where ebb's native
    module is built (storage/native/lmdb_pages.c: the same checks in tens of microseconds, where
    numpy's take about half a millisecond a megabyte), else in numpy (``_check``). With
    ``keep_map``, the file's map is kept for the next check until ``forget(path)``."""
    from .point_probe import _point_probe  # the native module, loaded (or turned off) there

    if _point_probe is None:
        buf, _ = _mapped(path, keep_map, None)
        _check(buf, path, txn_id)
        return
    the_map, size = _mapped(path, keep_map, _point_probe)
    failure = _point_probe.check_lmdb_pages(the_map, txn_id, size)
    if failure is not None:
        raise CorruptionError(f"{path}: {failure}")


# The file's map, kept from one check to the next: LMDB writes its pages in place through the
# page cache, so a kept map reads each version as it is, and a check touches no page it has not
# mapped before. The file grows by a few pages with most commits while the archive grows, so the
# native map is made with room to spare (``_ROOM``), and made again only when the file outgrows
# it; numpy's is exactly the file (an array of it), and made again whenever the size changes.
_ROOM = 64 << 20  # bytes of address space a native map reserves beyond the file (no memory)
_maps: dict[str, tuple[tuple[int, int], object, int]] = {}  # by path: ((device, inode), map, bytes it covers)


def _mapped(path: str, keep: bool, native) -> tuple[object, int]:
    """The whole of LMDB file ``path`` mapped read-only, and its size now: the kept map if it is
    of the same file (device and inode: a copy put in its place is mapped anew) and covers the
    file, else a new one (``native``'s, with room to grow, or a numpy array of the file), kept if
    ``keep``; CorruptionError if it cannot be read or is too short to be LMDB's."""
    try:
        st = os.stat(path)
        kept = _maps.get(path)
        if kept is not None and kept[0] == (st.st_dev, st.st_ino) and (
                st.st_size <= kept[2] if native is not None else st.st_size == kept[2]):
            return kept[1], st.st_size
        fd = os.open(path, os.O_RDONLY)
        try:
            st = os.fstat(fd)  # of the file opened, should another have been put in its place since
            if st.st_size < 2 * _PAGE_SIZES[0]:
                raise CorruptionError(f"{path}: the metadata file has {st.st_size} bytes, too few for LMDB")
            if native is not None:
                covers = st.st_size + _ROOM
                the_map = native.map_lmdb_file(fd, covers)
            else:
                covers = st.st_size
                the_map = np.frombuffer(mmap.mmap(fd, covers, prot=mmap.PROT_READ), np.uint8)  # closes with the array
        finally:
            os.close(fd)
    except OSError as e:
        raise CorruptionError(f"{path}: the metadata file cannot be read ({e.strerror})") from None
    if keep:
        _maps[path] = ((st.st_dev, st.st_ino), the_map, covers)
    return the_map, st.st_size


def newest_txnid_reader(path: str, env_info: Callable[[], dict]) -> Callable[[], int]:
    """A call returning the id of the last transaction committed to LMDB file ``path`` (the newer
    of its two meta pages', what LMDB's ``env_info()`` reports as ``last_txnid``): where the
    native module is built, read from the file's kept map (``check``'s), two words, where
    ``env_info`` builds a dict (about 2 us, a sixth of a warm probe); else ``env_info``'s, as
    also when the meta pages are not both valid (LMDB's own report then)."""
    from .point_probe import _point_probe

    if _point_probe is None:
        return lambda: env_info()["last_txnid"]
    the_map, size = _mapped(path, True, _point_probe)  # the meta pages lead the file: never past its end
    newest = _point_probe.newest_txnid

    def read() -> int:
        got = newest(the_map, size)
        return env_info()["last_txnid"] if got is None else got

    read()  # faults the meta pages into the map now, not in the first probe that asks
    return read


def forget(path: str) -> None:
    """Lets go of the kept map of LMDB file ``path`` (its environment was closed)."""
    _maps.pop(path, None)


def _check(buf: np.ndarray, path: str, txn_id: int) -> None:
    metas = [_meta(buf, at) for at in (0, None)]
    psize = metas[0]["psize"] if metas[0] else _PAGE_SIZES[0]
    metas[1] = _meta(buf, psize)
    meta = next((m for m in metas if m and m["txnid"] == txn_id), None)
    if meta is None and all(m and m["txnid"] > txn_id for m in metas):
        # two commits since the caller's transaction began have reused both meta pages: its
        # version's root is no longer named on disk (its pages are intact: the caller's
        # transaction holds them). Not damage; the next version is checked when first seen.
        return
    if meta is None:
        raise CorruptionError(f"{path}: no meta page names version {txn_id} (LMDB's meta pages are damaged)")
    psize = meta["psize"]
    if psize not in _PAGE_SIZES:
        raise CorruptionError(f"{path}: its meta page gives page size {psize}")
    # LMDB may count pages it allocated but never wrote (the file then ends before the meta's
    # last page); a tree must not reach past the file's end, where LMDB would fault
    last = min(meta["last_pg"], buf.size // psize - 1)
    pages = buf[:(buf.size // psize) * psize].reshape(-1, psize)
    for name, (root, depth) in (("free list", meta["free"]), ("main", meta["main"])):
        if root != _INVALID:
            _tree(pages, root, depth, last, f"{path}: {name} tree")


def _meta(buf: np.ndarray, at: int | None) -> dict | None:
    """The fields ``check`` needs of the meta page at byte ``at``, or None if it is not one."""
    if at is None or at + _HDR + 152 > buf.size:
        return None
    b = buf[at + _HDR:at + _HDR + 152]
    u32, u64 = b[:8].view(np.uint32), b[8:152].view(np.uint64)
    if int(u32[0]) != _MAGIC:
        return None

    def db(off: int) -> tuple[int, int]:  # MDB_db at byte ``off`` of the meta: (root, depth)
        depth = int(b[off + 6:off + 8].view(np.uint16)[0])
        return int(b[off + 40:off + 48].view(np.uint64)[0]), depth

    return {"psize": int(b[24:28].view(np.uint32)[0]), "free": db(24), "main": db(72),
            "last_pg": int(u64[(120 - 8) // 8]), "txnid": int(u64[(128 - 8) // 8])}


def _tree(pages: np.ndarray, root: int, depth: int, last: int, where: str) -> None:
    """Checks a B+-tree of ``depth`` levels from page ``root``, a level at a time."""
    if not 1 <= depth <= 32:
        raise CorruptionError(f"{where}: depth {depth}")
    level = np.array([root], np.uint64)
    for d in range(depth):
        leaf = d == depth - 1
        level = _level(pages, level, _LEAF if leaf else _BRANCH, last, where)


def _level(pages: np.ndarray, pgnos: np.ndarray, kind: int, last: int, where: str) -> np.ndarray:
    """Checks the pages ``pgnos`` (all of one kind, one level of a tree) and returns the pages
    their nodes point to: the next level's for branches, overflow pages' checked for leaves."""
    if (pgnos > last).any() or (pgnos < 2).any():
        raise CorruptionError(f"{where}: a node points to page {int(pgnos.max())} beyond the last, {last}")
    p = pages[pgnos.astype(np.int64)]
    psize = p.shape[1]
    h16 = p[:, :_HDR].copy().view(np.uint16)  # pgno (4 x u16), pad, flags, lower, upper
    own = p[:, :8].copy().view(np.uint64)[:, 0]
    flags, lower, upper = h16[:, 5].astype(np.int64), h16[:, 6].astype(np.int64), h16[:, 7].astype(np.int64)
    n = (lower - _HDR) // 2
    bad = (own != pgnos) | (flags != kind) | (n < 1) | (lower > upper) | (upper > psize) | (lower % 2 == 1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise CorruptionError(f"{where}: page {int(pgnos[i])} is damaged (not a well-formed LMDB page)")
    u16 = p.view(np.uint16)  # node pointers and headers are 2-byte aligned
    row = np.repeat(np.arange(p.shape[0]), n)
    idx = np.arange(row.size) - np.repeat(np.cumsum(n) - n, n)
    ptr = u16[row, _HDR // 2 + idx].astype(np.int64)
    hdr_ok = (ptr >= upper[row]) & (ptr % 2 == 0) & (ptr + _NODE <= psize)
    if not hdr_ok.all():
        raise CorruptionError(f"{where}: page {int(pgnos[row[~hdr_ok][0]])} has a node outside it")
    at = ptr // 2
    lo, hi, nf, ks = (u16[row, at + k].astype(np.int64) for k in range(4))
    if kind == _BRANCH:
        end = ptr + _NODE + ks
        child = (lo | (hi << 16) | (nf << 32)).astype(np.uint64)
    else:
        big = (nf & _BIGDATA) != 0
        dsize = lo | (hi << 16)
        end = ptr + _NODE + ks + np.where(big, 8, dsize)
    if (end > psize).any():
        raise CorruptionError(f"{where}: page {int(pgnos[row[end > psize][0]])} has a node running past its end")
    if kind == _BRANCH:
        return child
    if big.any():
        _overflow(pages, p, row[big], ptr[big] + _NODE + ks[big], dsize[big], pgnos, last, where)
    return pgnos[:0]


def _overflow(pages, p, rows, at, dsize, pgnos, last, where) -> None:
    """Checks the overflow pages of large values: their first page's number, kind and count
    cover the value and lie within the file."""
    psize = pages.shape[1]
    first = np.array([int(p[r, a:a + 8].view(np.uint64)[0]) for r, a in zip(rows.tolist(), at.tolist())], np.uint64)
    if (first > last).any() or (first < 2).any():
        raise CorruptionError(f"{where}: page {int(pgnos[rows[0]])} names an overflow page beyond the last")
    o = pages[first.astype(np.int64)]
    own = o[:, :8].copy().view(np.uint64)[:, 0]
    flags = o[:, 10:12].copy().view(np.uint16)[:, 0]
    count = o[:, 12:16].copy().view(np.uint32)[:, 0].astype(np.int64)
    need = (dsize + _HDR + psize - 1) // psize
    bad = (own != first) | (flags != _OVERFLOW) | (count < need) | (first.astype(np.int64) + count - 1 > last)
    if bad.any():
        raise CorruptionError(f"{where}: overflow page {int(first[np.flatnonzero(bad)[0]])} is damaged")
