/* The check of an LMDB file's pages before LMDB walks them (storage/page_walk.py), natively.
 *
 * page_walk.check runs once per version a process first reads: in a process other than the
 * writer, before the first probe after every commit. Its numpy walk costs about half a
 * millisecond for a megabyte of metadata (a few dozen numpy calls a tree level), more than the
 * rest of that probe; this walk reads the same pages and makes the same checks in tens of
 * microseconds. The layout is LMDB's own (mdb.c), as page_walk.py describes it, not ebb's.
 * The Python walk stays for a build without this module (EBB_NATIVE=0 in CI).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "lmdb_pages.h"

#define MAP_NAME "ebb.lmdb_map"

/* A read-only map of an LMDB file longer than the file (map_lmdb_file): the file grows a few
 * pages with most commits, and a map with room to spare serves the checks that follow without
 * being made again. Pages past the file's end are never touched (each check is given the
 * file's size as it is then). */
typedef struct {
    uint8_t *addr;
    size_t len;
} LmdbMap;

static void unmap_lmdb_file(PyObject *capsule) {
    LmdbMap *m = PyCapsule_GetPointer(capsule, MAP_NAME);
    if (m == NULL)
        return;
    munmap(m->addr, m->len);
    PyMem_Free(m);
}

PyObject *map_lmdb_file(PyObject *self, PyObject *args) {
    (void)self;
    int fd;
    unsigned long long len;
    if (!PyArg_ParseTuple(args, "iK", &fd, &len))
        return NULL;
    if (len == 0 || len > SIZE_MAX) {
        PyErr_SetString(PyExc_ValueError, "a map's length must be positive");
        return NULL;
    }
    LmdbMap *m = PyMem_Malloc(sizeof(LmdbMap));
    if (m == NULL)
        return PyErr_NoMemory();
    void *addr = mmap(NULL, (size_t)len, PROT_READ, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
        PyMem_Free(m);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    *m = (LmdbMap){addr, (size_t)len};
    PyObject *capsule = PyCapsule_New(m, MAP_NAME, unmap_lmdb_file);
    if (capsule == NULL) {
        munmap(addr, (size_t)len);
        PyMem_Free(m);
    }
    return capsule;
}

#define HDR 16  /* page header: pgno (8), pad (2), flags (2), lower (2), upper (2) */
#define NODE 8  /* node header: lo, hi, flags, ksize (2 each) */
#define META 152  /* the bytes of a meta page this check reads, after its header */
#define MAGIC 0xBEEFC0DEu
#define BRANCH 0x01
#define LEAF 0x02
#define OVERFLOW 0x04
#define BIGDATA 0x01
#define INVALID UINT64_MAX

static inline uint16_t u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

typedef struct {
    uint64_t txnid, last_pg, free_root, main_root;
    uint32_t psize;
    uint16_t free_depth, main_depth;
} Meta;

typedef struct {
    const uint8_t *file;
    uint64_t psize, last;
    uint64_t visits, budget;  /* pages visited; a well-formed tree visits each page at most once */
    char *msg;  /* the first failure, for page_walk to prefix with the file's path */
    size_t cap;
} Walk;

/* The meta page at byte ``at`` of a file of ``size`` bytes into ``m``; 0 if it is not one. */
static int meta_at(const uint8_t *file, uint64_t size, uint64_t at, Meta *m) {
    if (at + HDR + META > size)
        return 0;
    const uint8_t *b = file + at + HDR;
    if (u32(b) != MAGIC)
        return 0;
    m->psize = u32(b + 24);
    m->free_depth = u16(b + 24 + 6);
    m->free_root = u64(b + 24 + 40);
    m->main_depth = u16(b + 72 + 6);
    m->main_root = u64(b + 72 + 40);
    m->last_pg = u64(b + 120);
    m->txnid = u64(b + 128);
    return 1;
}

static int failed(Walk *w, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->msg, w->cap, fmt, ap);
    va_end(ap);
    return -1;
}

/* Checks the overflow pages of a large value of ``dsize`` bytes whose first page ``leaf``
 * names at byte ``at``. */
static int overflow(Walk *w, uint64_t leaf, const uint8_t *at, uint64_t dsize, const char *where) {
    uint64_t first = u64(at);
    if (first > w->last || first < 2)
        return failed(w, "%s: page %llu names an overflow page beyond the last", where, (unsigned long long)leaf);
    const uint8_t *o = w->file + first * w->psize;
    uint64_t need = (dsize + HDR + w->psize - 1) / w->psize;
    uint64_t count = u32(o + 12);
    if (u64(o) != first || u16(o + 10) != OVERFLOW || count < need || first + count - 1 > w->last)
        return failed(w, "%s: overflow page %llu is damaged", where, (unsigned long long)first);
    return 0;
}

/* Checks page ``pgno``, at ``level`` (0: the root) of a tree of ``depth`` levels, and below it. */
static int page(Walk *w, uint64_t pgno, int level, int depth, const char *where) {
    if (pgno > w->last || pgno < 2)
        return failed(w, "%s: a node points to page %llu beyond the last, %llu", where, (unsigned long long)pgno,
                      (unsigned long long)w->last);
    if (++w->visits > w->budget)
        return failed(w, "%s: its nodes reach page %llu more than once", where, (unsigned long long)pgno);
    const uint8_t *p = w->file + pgno * w->psize;
    int leaf = level == depth - 1;
    uint64_t psize = w->psize, lower = u16(p + 12), upper = u16(p + 14);
    int64_t n = ((int64_t)lower - HDR) / 2;
    if (u64(p) != pgno || u16(p + 10) != (leaf ? LEAF : BRANCH) || n < 1 || lower > upper || upper > psize || lower % 2)
        return failed(w, "%s: page %llu is damaged (not a well-formed LMDB page)", where, (unsigned long long)pgno);
    for (int64_t i = 0; i < n; i++) {
        uint64_t ptr = u16(p + HDR + 2 * i);
        if (ptr < upper || ptr % 2 || ptr + NODE > psize)
            return failed(w, "%s: page %llu has a node outside it", where, (unsigned long long)pgno);
        const uint8_t *node = p + ptr;
        uint64_t lo = u16(node), hi = u16(node + 2), nf = u16(node + 4), ks = u16(node + 6);
        uint64_t end = ptr + NODE + ks;
        int big = leaf && (nf & BIGDATA);
        if (leaf)
            end += big ? 8 : (lo | hi << 16);
        if (end > psize)
            return failed(w, "%s: page %llu has a node running past its end", where, (unsigned long long)pgno);
        if (!leaf && page(w, lo | hi << 16 | nf << 32, level + 1, depth, where) < 0)
            return -1;
        if (big && overflow(w, pgno, node + NODE + ks, lo | hi << 16, where) < 0)
            return -1;
    }
    return 0;
}

static int tree(Walk *w, uint64_t root, int depth, const char *where) {
    if (root == INVALID)
        return 0;
    if (depth < 1 || depth > 32)
        return failed(w, "%s: depth %d", where, depth);
    return page(w, root, 0, depth, where);
}

PyObject *check_lmdb_pages(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buf = {0};
    PyObject *file_arg;
    unsigned long long txn_id, size_arg = 0;
    if (!PyArg_ParseTuple(args, "OK|K", &file_arg, &txn_id, &size_arg))
        return NULL;
    const uint8_t *file;
    uint64_t size;
    if (PyCapsule_IsValid(file_arg, MAP_NAME)) {  /* the call's arguments hold the map while it runs */
        LmdbMap *m = PyCapsule_GetPointer(file_arg, MAP_NAME);
        if (size_arg > m->len) {
            PyErr_SetString(PyExc_ValueError, "the file's size is beyond its map");
            return NULL;
        }
        file = m->addr;
        size = size_arg;
    } else {
        if (PyObject_GetBuffer(file_arg, &buf, PyBUF_SIMPLE) < 0)
            return NULL;
        file = buf.buf;
        size = (uint64_t)buf.len;
    }
    char msg[256];
    Walk w = {file, 0, 0, 0, 0, msg, sizeof msg};
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    Meta metas[2];
    int ok0 = meta_at(file, size, 0, &metas[0]);
    int ok1 = meta_at(file, size, ok0 ? metas[0].psize : 4096, &metas[1]);
    const Meta *m = ok0 && metas[0].txnid == txn_id ? &metas[0] : ok1 && metas[1].txnid == txn_id ? &metas[1] : NULL;
    if (m == NULL) {
        /* two commits since the caller's transaction began have reused both meta pages: its
         * version's root is no longer named on disk (its pages are intact: not damage) */
        if (!(ok0 && ok1 && metas[0].txnid > txn_id && metas[1].txnid > txn_id))
            bad = failed(&w, "no meta page names version %llu (LMDB's meta pages are damaged)", txn_id);
    } else if (m->psize != 4096 && m->psize != 8192 && m->psize != 16384 && m->psize != 32768 && m->psize != 65536) {
        bad = failed(&w, "its meta page gives page size %u", m->psize);
    } else {
        w.psize = m->psize;
        /* LMDB may count pages it allocated but never wrote (the file then ends before the
         * meta's last page); a tree must not reach past the file's end, where LMDB would fault.
         * A file of fewer than 3 such pages holds no tree page (0 and 1 are the meta pages). */
        uint64_t pages = size / w.psize;
        w.last = pages < 3 ? 1 : m->last_pg < pages - 1 ? m->last_pg : pages - 1;
        w.budget = w.last + 1;
        bad = tree(&w, m->free_root, m->free_depth, "free list tree") < 0
              || tree(&w, m->main_root, m->main_depth, "main tree") < 0;
    }
    Py_END_ALLOW_THREADS
    if (buf.obj != NULL)
        PyBuffer_Release(&buf);
    if (bad)
        return PyUnicode_FromString(msg);
    Py_RETURN_NONE;
}

PyObject *newest_txnid(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *capsule;
    unsigned long long size;
    if (!PyArg_ParseTuple(args, "OK", &capsule, &size))
        return NULL;
    LmdbMap *m = PyCapsule_GetPointer(capsule, MAP_NAME);
    if (m == NULL)
        return NULL;
    if (size > m->len) {
        PyErr_SetString(PyExc_ValueError, "the file's size is beyond its map");
        return NULL;
    }
    /* the two meta pages LMDB alternates between; the newer names the last commit (mdb.c's
     * mdb_env_pick_meta, which mdb_env_info reports) */
    Meta metas[2];
    int ok0 = meta_at(m->addr, size, 0, &metas[0]);
    int ok1 = ok0 && meta_at(m->addr, size, metas[0].psize, &metas[1]);
    if (!ok1)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(metas[0].txnid > metas[1].txnid ? metas[0].txnid : metas[1].txnid);
}
