/* Point probes of an int64 or string key, one key or many, executed in one call
 * (ebb.storage._point_probe).
 *
 * A probe visits one or two blocks in each of a handful of runs. Driving that from Python costs
 * a few hundred interpreter calls, several times what the search itself costs, so this module
 * does the whole keyed read natively: it picks the blocks of each run that may hold the key
 * (the same choice as read_plan.plan, less those whose key filter rules the key out), decodes each block's Arrow IPC metadata in place in the
 * run file's memory map, checks the page sum of every page before using a byte of it (as
 * page_check does), finds the key's rows, keeps those valid at as_of, orders them by (exp, ts)
 * and copies them into one Arrow record batch that pyarrow imports through the C data interface
 * (storage/point_probe.py). A block that fails a check raises BlockError; nothing is returned.
 * The work between reading the arguments and building the batch runs without the GIL; a probe of
 * many blocks shares their searches and checks among threads (``each_candidate``).
 *
 * Page sums are the low 32 bits of XXH3-64 (checksum.page_sum), from the vendored xxhash.h.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#if defined(__has_include)
#if __has_include(<sys/syscall.h>)
#include <sys/syscall.h>
#endif
#else
#include <sys/syscall.h>
#endif

/* process_madvise through a pidfd of this process (Linux 5.10 on); where the headers do not
 * define both syscalls (older Linux headers, other systems), read-ahead advice is one madvise a
 * range, as it is at run time when the syscall fails. */
#if defined(SYS_pidfd_open) && defined(SYS_process_madvise)
#define HAVE_PROCESS_MADVISE 1
#endif
#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

#define XXH_INLINE_ALL
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* Page sums with AVX2 where the CPU has it, chosen at run time (as xxhash's own x86 dispatcher
 * does): the module is built for any x86-64, and a probe spends about 40% of its time summing
 * the pages it reads (half that with AVX2). The accumulator is then 64-byte aligned. */
#include <immintrin.h>
#define XXH_X86DISPATCH
#define XXH_DISPATCH_AVX2 1
#define XXH_TARGET_AVX2 __attribute__((__target__("avx2")))
#define PAGE_HASH_AVX2 1
#endif
#include "xxhash.h"
#include "lmdb_pages.h"

#ifdef PAGE_HASH_AVX2
static int cpu_avx2;  /* set at import */

static XXH_TARGET_AVX2 XXH64_hash_t long_hash_avx2(const uint8_t *p, size_t n) {
    return XXH3_hashLong_64b_internal(p, n, XXH3_kSecret, sizeof(XXH3_kSecret), XXH3_accumulate_avx2,
                                      XXH3_scrambleAcc_avx2);
}
#endif

/* XXH3-64 of [p, p + n): the same value on every CPU. */
static inline XXH64_hash_t page_hash(const uint8_t *p, size_t n) {
#ifdef PAGE_HASH_AVX2
    if (n > XXH3_MIDSIZE_MAX && cpu_avx2)
        return long_hash_avx2(p, n);
#endif
    return XXH3_64bits(p, n);
}

/* The format facts this file is written against (disk_format.native_constants, checked at import
 * by check_format): pages, the IPC message prefix, the metadata guess, key filters. */
#define PAGE 4096
#define PAGE_SUM_BYTES 4
#define IPC_PREFIX 8         /* continuation marker and metadata length */
#define IPC_CONTINUATION 0xFFFFFFFFu
#define METADATA_GUESS 1024  /* about how many bytes of a block precede its first buffer */
#define MAX_COLUMNS 4096
#define FILTER_UNIT 64        /* key_filter.UNIT_BYTES: FILTER_BITS bits, then a 4-byte sum */
#define FILTER_SUM 4
#define FILTER_BITS ((FILTER_UNIT - FILTER_SUM) * 8)
#define FILTER_PROBES 7       /* key_filter.PROBES: from 9-bit fields of the second mix */
#define FILTER_TEXT_MULTIPLIER 0x100000001B3ULL  /* disk_format.FILTER_TEXT_MULTIPLIER */

enum { FIXED = 0, BOOL = 1, VARIABLE = 2 };

static PyObject *BlockError;

/* -- little-endian loads that tolerate any alignment ------------------------------------------ */
static inline uint16_t ld16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t ld32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline int32_t ldi32(const uint8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }
static inline int64_t ldi64(const uint8_t *p) { int64_t v; memcpy(&v, p, 8); return v; }
static inline uint64_t ld64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* disk_format.BLOCK, packed little-endian: each field's byte offset, and the entry's size */
#define E_OFFSET 0
#define E_LENGTH 8
#define E_ROWS 12
#define E_MIN_EXP 16
#define E_MAX_EXP 24
#define E_MAX_TS 32
#define E_SLOT 40
#define E_CHECKSUM 48
#define ENTRY_BYTES 56
typedef struct { uint64_t offset; uint32_t length, rows; int64_t min_exp, max_exp, max_ts, slot; uint64_t checksum; } Entry;
_Static_assert(sizeof(Entry) == ENTRY_BYTES, "an Entry holds a BLOCK entry's fields");

static Entry entry_at(const uint8_t *blocks, Py_ssize_t b) {
    const uint8_t *p = blocks + b * ENTRY_BYTES;
    Entry e = {ld64(p + E_OFFSET), ld32(p + E_LENGTH), ld32(p + E_ROWS), ldi64(p + E_MIN_EXP), ldi64(p + E_MAX_EXP),
               ldi64(p + E_MAX_TS), ldi64(p + E_SLOT), ld64(p + E_CHECKSUM)};
    return e;
}

/* One column of a decoded block: where its buffers lie in the map (NULL validity: no nulls). */
typedef struct { const uint8_t *validity, *values, *data; uint64_t data_len; } Column;

/* One row to return: its block (candidate), its row, and what orders it (``key``: the key's
 * place among a batch probe's sorted keys, 0 for a single key). */
typedef struct { Py_ssize_t block, row, seq, key; int64_t exp, ts; } Row;

/* The stored schema (point_probe.ColumnLayout): each column's kind and width, where the key, ts
 * and exp columns are, and how many leading columns a probe returns. */
typedef struct {
    int ncols, nout, key, ts, exp;
    int text_key;  /* the key column is variable-width (string): keys compare as bytes */
    const int32_t *kind, *width;
} Layout;

/* A key: an int64, or (``text_key``) ``n`` bytes at ``s``, compared as unsigned bytes (UTF-8 in
 * byte order is code point order, Python's and Arrow's order of strings). */
typedef struct { int64_t i; const uint8_t *s; uint64_t n; } Key;

static inline int compare_keys(const Key *a, const Key *b, int text) {
    if (!text)
        return a->i < b->i ? -1 : a->i > b->i;
    uint64_t n = a->n < b->n ? a->n : b->n;
    int c = n ? memcmp(a->s, b->s, n) : 0;
    return c ? (c < 0 ? -1 : 1) : a->n < b->n ? -1 : a->n > b->n;
}

/* Where ``k`` lies between ``lo`` and ``hi`` (0 to 1, clamped): for text keys, by the 8 bytes
 * after their common prefix, read as a big-endian number. */
static double spread(const Key *lo, const Key *hi, const Key *k, int text) {
    double a, b, x;
    if (!text) {
        a = (double)lo->i, b = (double)hi->i, x = (double)k->i;
    } else {
        uint64_t p = 0, n = lo->n < hi->n ? lo->n : hi->n;
        while (p < n && lo->s[p] == hi->s[p])
            p++;
        uint64_t v[3] = {0, 0, 0};
        const Key *ks[3] = {lo, hi, k};
        for (int j = 0; j < 3; j++)
            for (uint64_t q = p; q < p + 8; q++)
                v[j] = (v[j] << 8) | (q < ks[j]->n ? ks[j]->s[q] : 0);
        a = (double)v[0], b = (double)v[1], x = (double)v[2];
    }
    double f = b > a ? (x - a) / (b - a) : 0.0;
    return f < 0 ? 0 : f > 1 ? 1 : f;
}

/* -- errors ------------------------------------------------------------------------------------ */
/* The first failure of a probe, raised as BlockError once the GIL is held again (or MemoryError).
 * ``errnum``: the errno of a failed system call (the file may be intact), 0 for damage found. */
typedef struct { Py_ssize_t run; int64_t offset; int nomem, errnum; char msg[240]; } Error;

static int fail(Error *err, Py_ssize_t run, int64_t offset, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    err->run = run;
    err->offset = offset;
    return -1;
}

static int no_memory(Error *err) {
    err->nomem = 1;
    return -1;
}

static PyObject *raise(const Error *err) {
    if (err->nomem)
        return PyErr_NoMemory();
    PyObject *args = Py_BuildValue("(nLsi)", err->run, (long long)err->offset, err->msg, err->errnum);
    if (args != NULL) {
        PyErr_SetObject(BlockError, args);
        Py_DECREF(args);
    }
    return NULL;
}

/* -- page checks ------------------------------------------------------------------------------- */
typedef struct {
    const uint8_t *p;       /* the block in the map */
    uint64_t len;
    const uint32_t *sums;   /* one per page, or NULL: the whole block was checked */
    uint8_t *checked;       /* per page */
    Py_ssize_t run;
    uint64_t offset;        /* of the block in its file, for messages */
    Error *err;
} Block;

/* Makes room for item ``n`` of the array ``*items`` of ``*cap`` items of ``size`` bytes (doubling
 * it when full); -1 if out of memory. */
static int grow(void *items, Py_ssize_t n, Py_ssize_t *cap, size_t size, Error *err) {
    if (n < *cap)
        return 0;
    Py_ssize_t more = *cap ? 2 * *cap : 16;
    void *p = realloc(*(void **)items, (size_t)more * size);
    if (p == NULL)
        return no_memory(err);
    *(void **)items = p;
    *cap = more;
    return 0;
}

/* Ranges of the maps to read ahead (MADV_WILLNEED), advised together: on a cold cache the reads
 * of every block are then in flight at once. */
typedef struct { struct iovec *v; Py_ssize_t n, cap; size_t longest; } Ahead;

#define SMALL_AHEAD (4 * PAGE)  /* ranges no longer than this are advised only on a cold cache */
/* A range that starts at most this far past the previous one's end joins it: one read of the
 * span between costs less than a read of its own (on the bench machine's disk a 4 KiB read takes
 * about 55 us, and reads in flight together did not overlap much; 32 KiB more takes about 12 us).
 * A found row's columns lie a column's length apart in its block, so they are mostly one read. */
#define JOIN_GAP (8 * PAGE)

/* Asks for bytes [from, to) of block ``b``, widened to the block's pages holding them: those are
 * what check_span hashes, and a block starts anywhere in its file, not on a page of memory, so
 * a block page mostly spans two (a page of memory not asked for is a read of its own). */
static int ahead_add(Ahead *A, const Block *b, const uint8_t *from, const uint8_t *to, Error *err) {
    if (to <= from)
        return 0;
    uintptr_t a = (uintptr_t)from & ~(uintptr_t)(PAGE - 1);
    if ((uintptr_t)to - a > A->longest)  /* of the ranges asked for, not widened or joined: the warm test's measure */
        A->longest = (uintptr_t)to - a;
    uint64_t lo = (uint64_t)(from - b->p) / PAGE * PAGE, hi = ((uint64_t)(to - b->p) + PAGE - 1) / PAGE * PAGE;
    a = (uintptr_t)(b->p + lo) & ~(uintptr_t)(PAGE - 1);
    to = b->p + (hi < b->len ? hi : b->len);
    if (A->n) {
        struct iovec *last = &A->v[A->n - 1];
        uintptr_t base = (uintptr_t)last->iov_base, end = base + last->iov_len;
        if (a >= base && a <= end + JOIN_GAP) {
            if ((uintptr_t)to > end)
                last->iov_len = (uintptr_t)to - base;
            return 0;
        }
    }
    if (grow(&A->v, A->n, &A->cap, sizeof(struct iovec), err) < 0)
        return -1;
    A->v[A->n++] = (struct iovec){(void *)a, (uintptr_t)to - a};
    return 0;
}

#ifdef HAVE_PROCESS_MADVISE
static int self_pidfd = -1;  /* for process_madvise; opened with the GIL held (``open_pidfd``) */
static int pidfd_opened = 0;  /* reset in a forked child, whose pidfd must be its own */

static void forked_child(void) {
    if (self_pidfd >= 0)
        close(self_pidfd);  /* the parent's */
    self_pidfd = -1;
    pidfd_opened = 0;
}
#endif

/* Opens this process's pidfd once (not a getpid per probe: a fork handler says when to again). */
static void open_pidfd(void) {
#ifdef HAVE_PROCESS_MADVISE
    if (pidfd_opened)
        return;
    self_pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    pidfd_opened = 1;
#endif
}

#define WARM_SAMPLES 4  /* ranges whose first page the warm test looks at */

static int page_in_memory(const void *p) {
    unsigned char resident = 0;
    return mincore((void *)p, 1, &resident) == 0 && (resident & 1);
}

/* Whether the ranges gathered are in memory already, so that advice would only cost (on a few
 * resident pages it costs more than a small probe's own reads). Only ranges of a few pages count.
 * In a probe's first round (``first``) the cache is taken as warm when the first pages of
 * WARM_SAMPLES ranges spread over the list are in memory. A later round of a cold probe follows
 * reads of the same blocks, so some of its ranges are in memory either way: it is skipped only
 * when it has at most WARM_SAMPLES ranges and every one is (one resident range in a list of
 * hundreds said nothing of the others: they were read a page fault at a time). */
static int in_memory(const Ahead *A, int first) {
    if (A->n == 0 || A->longest > SMALL_AHEAD || (!first && A->n > WARM_SAMPLES))
        return 0;
    Py_ssize_t step = A->n > WARM_SAMPLES ? (A->n - 1) / (WARM_SAMPLES - 1) : 1;
    for (Py_ssize_t i = 0; i < A->n; i += step)
        if (!page_in_memory(A->v[i].iov_base))
            return 0;
    return 1;
}

/* Asks for every range at once: one process_madvise where the kernel allows it (Linux 5.10 on,
 * with the rights it wants), else one madvise a range. Only advice, so failures are ignored.
 * Skipped, returning 1, when the ranges are in memory already (``in_memory``). */
static int ahead_flush(Ahead *A, int first) {
    Py_ssize_t done = 0;
    int warm = in_memory(A, first);
    if (warm)
        done = A->n;
#ifdef HAVE_PROCESS_MADVISE
    if (self_pidfd >= 0)
        while (done < A->n) {
            Py_ssize_t n = A->n - done < IOV_MAX ? A->n - done : IOV_MAX;
            if (syscall(SYS_process_madvise, self_pidfd, A->v + done, (size_t)n, MADV_WILLNEED, 0) < 0)
                break;
            done += n;
        }
#endif
    for (; done < A->n; done++)
        madvise(A->v[done].iov_base, A->v[done].iov_len, MADV_WILLNEED);
    A->n = 0;
    A->longest = 0;
    return warm;
}

/* Checks the pages holding block bytes [start, stop) (each once); -1 (error set) if one fails
 * its sum or the span lies outside the block. */
static int check_span(Block *b, uint64_t start, uint64_t stop) {
    if (start >= stop)
        return 0;
    if (stop > b->len)
        return fail(b->err, b->run, b->offset, "bytes %llu-%llu lie outside the block", (unsigned long long)start,
                    (unsigned long long)stop);
    if (b->sums == NULL)
        return 0;
    uint64_t first = start / PAGE, last = (stop - 1) / PAGE;
    for (uint64_t pg = first; pg <= last; pg++) {
        if (b->checked[pg])
            continue;
        uint64_t at = pg * PAGE, n = b->len - at < PAGE ? b->len - at : PAGE;
        if ((uint32_t)page_hash(b->p + at, n) != b->sums[pg])
            return fail(b->err, b->run, b->offset, "page %llu fails its checksum", (unsigned long long)pg);
        b->checked[pg] = 1;
    }
    return 0;
}

/* -- the block's IPC metadata (a flatbuffer Message holding a RecordBatch) ----------------------- */
typedef struct { const uint8_t *m; uint64_t n; } Flat;

/* The position of table field ``i`` (0 if absent), or -1 if the table does not fit. */
static int64_t field(Flat f, uint64_t table, int i) {
    if (table + 4 > f.n)
        return -1;
    int64_t vt = (int64_t)table - ldi32(f.m + table);
    if (vt < 0 || (uint64_t)vt + 4 > f.n)
        return -1;
    uint16_t vsize = ld16(f.m + vt);
    if ((uint64_t)vt + vsize > f.n)
        return -1;
    if (4 + 2 * i + 2 > vsize)
        return 0;
    uint16_t off = ld16(f.m + vt + 4 + 2 * i);
    if (off == 0)
        return 0;
    return table + off >= f.n ? -1 : (int64_t)(table + off);
}

/* The target of the offset stored at ``at`` (a table or vector), or -1 if outside. */
static int64_t deref(Flat f, int64_t at) {
    if (at <= 0 || (uint64_t)at + 4 > f.n)
        return -1;
    uint64_t t = (uint64_t)at + ld32(f.m + at);
    return t + 4 > f.n ? -1 : (int64_t)t;
}

/* The elements of the vector of 16-byte structs at table field ``i``: their count, or -1. */
static int64_t struct_vector(Flat f, uint64_t table, int i, const uint8_t **items) {
    int64_t at = field(f, table, i);
    if (at <= 0)
        return -1;
    int64_t v = deref(f, at);
    if (v < 0)
        return -1;
    uint64_t count = ld32(f.m + v);
    if (v + 4 + count * 16 > f.n)
        return -1;
    *items = f.m + v + 4;
    return (int64_t)count;
}

/* Decodes block ``b`` (``rows`` rows) into ``cols`` after checking its metadata pages and every
 * buffer's bounds; no column value is checked yet. */
static int decode(Block *b, const Layout *L, uint32_t rows, Column *cols) {
    if (check_span(b, 0, IPC_PREFIX) < 0)
        return -1;
    int32_t meta = ldi32(b->p + 4);
    if (ld32(b->p) != IPC_CONTINUATION || meta <= 0 || (uint64_t)meta > b->len - IPC_PREFIX)
        return fail(b->err, b->run, b->offset, "metadata length %d does not fit the block", meta);
    if (check_span(b, 0, IPC_PREFIX + (uint64_t)meta) < 0)
        return -1;
    Flat f = {b->p + IPC_PREFIX, (uint64_t)meta};
    if (f.n < 4)
        return fail(b->err, b->run, b->offset, "cannot be decoded (metadata too short)");
    uint64_t msg = ld32(f.m);
    int64_t type_at = field(f, msg, 1), header_at = field(f, msg, 2);
    if (type_at <= 0 || f.m[type_at] != 3 /* RecordBatch */ || header_at <= 0)
        return fail(b->err, b->run, b->offset, "cannot be decoded (not a record batch)");
    int64_t rb = deref(f, header_at);
    int64_t length_at = rb < 0 ? -1 : field(f, rb, 0);
    if (length_at <= 0 || length_at + 8 > (int64_t)f.n)
        return fail(b->err, b->run, b->offset, "cannot be decoded (no row count)");
    if (ldi64(f.m + length_at) != (int64_t)rows)
        return fail(b->err, b->run, b->offset, "holds %lld rows, its descriptor says %u", (long long)ldi64(f.m + length_at), rows);
    if (field(f, rb, 3) != 0)
        return fail(b->err, b->run, b->offset, "cannot be decoded (compressed buffers)");
    const uint8_t *nodes, *bufs;
    int64_t nn = struct_vector(f, rb, 1, &nodes), nb = struct_vector(f, rb, 2, &bufs);
    int want = 0;
    for (int c = 0; c < L->ncols; c++)
        want += L->kind[c] == VARIABLE ? 3 : 2;
    if (nn != L->ncols || nb != want)
        return fail(b->err, b->run, b->offset, "cannot be decoded (%lld columns, %lld buffers)", (long long)nn, (long long)nb);
    uint64_t body = IPC_PREFIX + (uint64_t)meta, space = b->len - body;
    int j = 0;
    for (int c = 0; c < L->ncols; c++) {
        int64_t length = ldi64(nodes + 16 * c), nulls = ldi64(nodes + 16 * c + 8);
        if (length != (int64_t)rows || nulls < 0 || nulls > length)
            return fail(b->err, b->run, b->offset, "cannot be decoded (column %d: %lld rows, %lld nulls)", c, (long long)length,
                        (long long)nulls);
        int nbuf = L->kind[c] == VARIABLE ? 3 : 2;
        const uint8_t *at[3];
        uint64_t len[3];
        for (int k = 0; k < nbuf; k++, j++) {
            int64_t off = ldi64(bufs + 16 * j), n = ldi64(bufs + 16 * j + 8);
            if (off < 0 || n < 0 || (uint64_t)off > space || (uint64_t)n > space - (uint64_t)off)
                return fail(b->err, b->run, b->offset, "cannot be decoded (buffer %d outside the block)", j);
            at[k] = b->p + body + off;
            len[k] = (uint64_t)n;
        }
        uint64_t need = L->kind[c] == FIXED ? (uint64_t)L->width[c] * rows
                      : L->kind[c] == BOOL ? (rows + 7) / 8 : 4 * ((uint64_t)rows + 1);
        if (len[1] < need || (len[0] == 0 && nulls) || (len[0] && len[0] < (rows + 7) / 8))
            return fail(b->err, b->run, b->offset, "cannot be decoded (column %d's buffers are too short)", c);
        if (nulls && (c == L->key || c == L->ts || c == L->exp))
            return fail(b->err, b->run, b->offset, "cannot be decoded (nulls in column %d)", c);
        cols[c].validity = len[0] && nulls ? at[0] : NULL;  /* as Arrow reads it: no nulls counted, no bitmap */
        cols[c].values = at[1];
        cols[c].data = nbuf == 3 ? at[2] : NULL;
        cols[c].data_len = nbuf == 3 ? len[2] : 0;
    }
    return 0;
}

static inline uint64_t in_block(const Block *b, const uint8_t *p) { return (uint64_t)(p - b->p); }

/* Checks the bytes of rows [a, z) of column ``c`` (and of its string data). */
static int check_rows(Block *b, const Layout *L, const Column *col, int c, uint64_t a, uint64_t z) {
    if (col->validity && check_span(b, in_block(b, col->validity) + a / 8, in_block(b, col->validity) + (z + 7) / 8) < 0)
        return -1;
    uint64_t v = in_block(b, col->values);
    if (L->kind[c] == FIXED)
        return check_span(b, v + (uint64_t)L->width[c] * a, v + (uint64_t)L->width[c] * z);
    if (L->kind[c] == BOOL)
        return check_span(b, v + a / 8, v + (z + 7) / 8);
    if (check_span(b, v + 4 * a, v + 4 * (z + 1)) < 0)
        return -1;
    int32_t lo = ldi32(col->values + 4 * a), hi = ldi32(col->values + 4 * z);
    if (lo < 0 || hi < lo || (uint64_t)hi > col->data_len)
        return fail(b->err, b->run, b->offset, "cannot be decoded (column %d's offsets %d-%d)", c, lo, hi);
    for (uint64_t r = a; r < z; r++)
        if (ldi32(col->values + 4 * r + 4) < ldi32(col->values + 4 * r))
            return fail(b->err, b->run, b->offset, "cannot be decoded (column %d's offsets decrease)", c);
    uint64_t d = in_block(b, col->data);
    return check_span(b, d + (uint64_t)lo, d + (uint64_t)hi);
}

/* The key of row ``row``, after checking the pages it lies in: a search checks only the pages it
 * reads, not the whole key column. */
static int key_at(Block *b, const Column *k, int text, uint64_t row, Key *key) {
    if (!text) {
        uint64_t at = in_block(b, k->values) + 8 * row;
        if (b->sums != NULL && !(b->checked[at / PAGE] && b->checked[(at + 7) / PAGE]) && check_span(b, at, at + 8) < 0)
            return -1;
        key->i = ldi64(k->values + 8 * row);
        return 0;
    }
    uint64_t at = in_block(b, k->values) + 4 * row;
    if (check_span(b, at, at + 8) < 0)
        return -1;
    int32_t lo = ldi32(k->values + 4 * row), hi = ldi32(k->values + 4 * row + 4);
    if (lo < 0 || hi < lo || (uint64_t)hi > k->data_len)
        return fail(b->err, b->run, b->offset, "cannot be decoded (key offsets %d-%d)", lo, hi);
    uint64_t d = in_block(b, k->data);
    if (check_span(b, d + (uint64_t)lo, d + (uint64_t)hi) < 0)
        return -1;
    key->s = k->data + lo;
    key->n = (uint64_t)(hi - lo);
    return 0;
}

/* The first row (of ``rows``, sorted by key) whose key is >= ``key`` (``after``: > ``key``),
 * galloping out from row ``guess`` and then bisecting, so that a good guess reads a page or two. */
static int search(Block *b, const Column *k, int text, uint64_t rows, const Key *key, uint64_t guess, int after,
                  uint64_t *out) {
    uint64_t lo, hi, step = 1;  /* rows before lo are below the bound, rows from hi on are not */
    Key x = {0};
#define AT_OR_PAST(x) (compare_keys(&(x), key, text) > 0 || (!after && compare_keys(&(x), key, text) == 0))
    if (rows == 0) {
        *out = 0;
        return 0;
    }
    if (guess >= rows)
        guess = rows - 1;
    if (key_at(b, k, text, guess, &x) < 0)
        return -1;
    if (AT_OR_PAST(x)) {
        for (hi = guess, lo = 0; hi >= step; step *= 2) {
            if (key_at(b, k, text, hi - step, &x) < 0)
                return -1;
            if (!AT_OR_PAST(x)) {
                lo = hi - step + 1;
                break;
            }
            hi -= step;
        }
    } else {
        for (lo = guess + 1, hi = rows; lo - 1 + step < rows; step *= 2) {
            if (key_at(b, k, text, lo - 1 + step, &x) < 0)
                return -1;
            if (AT_OR_PAST(x)) {
                hi = lo - 1 + step;
                break;
            }
            lo += step;
        }
    }
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (key_at(b, k, text, mid, &x) < 0)
            return -1;
        if (AT_OR_PAST(x)) hi = mid; else lo = mid + 1;
    }
#undef AT_OR_PAST
    *out = lo;
    return 0;
}

/* Rows [*a, *z) of the block (sorted by key) whose key is ``key``, searched from row ``guess``. */
static int key_rows(Block *b, const Layout *L, const Column *cols, uint32_t rows, const Key *key, uint64_t guess,
                    uint64_t *a, uint64_t *z) {
    if (search(b, &cols[L->key], L->text_key, rows, key, guess, 0, a) < 0)
        return -1;
    return search(b, &cols[L->key], L->text_key, rows, key, *a, 1, z);
}

/* -- the runs ---------------------------------------------------------------------------------- */
/* A run's map and arrays as buffers (``prepared_run``); in a run set, with its liveness in that version. */
typedef struct {
    Py_buffer map, first, last, blocks, sections, page_start, sums, first_at, last_at, filter_at, filter_bytes;
    int have_map, have_sums, nbuf, text;  /* text: first and last are bytes, first_at and last_at their int64 offsets */
    int filters;  /* filter_bytes: the run's key filters (in memory); filter_at: where each block's starts, then the end */
    Py_ssize_t run_units;  /* units of its run filter, the last of filter_bytes (0: none); run_unit0 the first's index */
    uint64_t run_unit0;
    int fd;
    int64_t max_exp, first_live;
} Run;

static void release_run(Run *r) {
    Py_buffer *all[] = {&r->first, &r->last, &r->blocks, &r->sections, &r->page_start, &r->sums, &r->first_at,
                        &r->last_at, &r->filter_at, &r->filter_bytes};
    for (int i = 0; i < 10; i++)
        if (all[i]->obj != NULL)  /* acquired */
            PyBuffer_Release(all[i]);
    if (r->have_map)
        PyBuffer_Release(&r->map);
}

static int open_run(PyObject *t, Run *r) {
    PyObject *map, *first, *last, *blocks, *sections, *page_start, *sums, *first_at = Py_None, *last_at = Py_None,
             *filter_at = Py_None, *filter_bytes = Py_None;
    memset(r, 0, sizeof *r);
    if (!PyArg_ParseTuple(t, "OiOOOOOO|OOOOn", &map, &r->fd, &first, &last, &blocks, &sections, &page_start, &sums,
                          &first_at, &last_at, &filter_at, &filter_bytes, &r->run_units))
        return -1;
    r->have_sums = sums != Py_None;
    r->text = first_at != Py_None;
    r->filters = filter_at != Py_None && filter_bytes != Py_None;
    PyObject *objs[] = {first, last, blocks, sections, page_start, sums, first_at, last_at,
                        r->filters ? filter_at : Py_None, r->filters ? filter_bytes : Py_None};
    Py_buffer *bufs[] = {&r->first, &r->last, &r->blocks, &r->sections, &r->page_start, &r->sums, &r->first_at,
                         &r->last_at, &r->filter_at, &r->filter_bytes};
    for (int i = 0; i < 10; i++)
        if (objs[i] != Py_None && PyObject_GetBuffer(objs[i], bufs[i], PyBUF_C_CONTIGUOUS) < 0)
            return -1;
    if (map != Py_None) {
        if (PyObject_GetBuffer(map, &r->map, PyBUF_SIMPLE) < 0)
            return -1;
        r->have_map = 1;
    }
    return 0;
}

/* Key ``i`` of a run's first (``last``: last) keys of its blocks. */
static inline Key run_key(const Run *r, int last, Py_ssize_t i) {
    const Py_buffer *v = last ? &r->last : &r->first;
    Key k = {0};
    if (!r->text) {
        k.i = ldi64((const uint8_t *)v->buf + 8 * i);
    } else {
        const uint8_t *at = (const uint8_t *)(last ? r->last_at.buf : r->first_at.buf);
        int64_t lo = ldi64(at + 8 * i), hi = ldi64(at + 8 * i + 8);
        k.s = (const uint8_t *)v->buf + lo;
        k.n = (uint64_t)(hi - lo);
    }
    return k;
}

/* First block index in [a, b) whose first (``last``: last) key is >= key (``after``: > key). */
static Py_ssize_t bisect(const Run *r, int last, Py_ssize_t a, Py_ssize_t b, const Key *key, int after) {
    while (a < b) {
        Py_ssize_t mid = (a + b) / 2;
        Key x = run_key(r, last, mid);
        int c = compare_keys(&x, key, r->text);
        if (c < 0 || (after && c == 0)) a = mid + 1; else b = mid;
    }
    return a;
}

static int compare_rows(const void *x, const void *y) {
    const Row *a = x, *b = y;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    if (a->exp != b->exp) return a->exp < b->exp ? -1 : 1;
    if (a->ts != b->ts) return a->ts < b->ts ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

/* -- the probe --------------------------------------------------------------------------------- */
/* A block to search: where it is, then (once decoded) its columns and the key's rows [a, z). */
typedef struct {
    Py_ssize_t run, index;
    Entry e;
    Block b;
    uint64_t guess;  /* the row where the key would be if the block's keys were spread evenly */
    Column *cols;
    uint64_t a, z;
    int whole;  /* most of the block is asked for: checked whole against its checksum */
} Candidate;

typedef struct {
    Candidate *cand;
    Row *rows;
    Py_ssize_t ncand, nrows;
    int64_t *seen, *bytes;  /* per run: blocks searched and their bytes */
    int64_t *size;          /* per run: its file's size, read once a probe (-1: not yet) */
    Ahead ahead;
    int advise;  /* ask for what the probe reads ahead of reading it (the cache may be cold) */
    int warm;    /* the first round found its ranges in memory (``in_memory``): the cache is warm */
} Probe;

/* Asks for the ranges gathered (``ahead_flush``) if the probe advises and its first round
 * (``first``) did not find the cache warm, else drops them: on a warm cache the advice, and the
 * mincore that tells it is warm, cost a probe more than they save. */
static void advise(Probe *P, int first) {
    if (P->advise && (first || !P->warm))
        P->warm |= ahead_flush(&P->ahead, first);
    else
        P->ahead.n = P->ahead.longest = 0;
}

static void free_probe(Probe *P) {
    for (Py_ssize_t k = 0; k < P->ncand; k++) {
        free(P->cand[k].cols);
        free(P->cand[k].b.checked);
    }
    free(P->cand);
    free(P->rows);
    free(P->seen);
    free(P->bytes);
    free(P->size);
    free(P->ahead.v);
}

/* The size of run ``i``'s file, read once a probe: whatever a probe touches must lie inside the
 * file as it is now (touching a page past the end of a file would kill the process). */
static int file_size(Probe *P, Run *runs, Py_ssize_t i, int64_t offset, Error *err, int64_t *size) {
    if (P->size[i] < 0) {
        struct stat st;
        if (!runs[i].have_map)
            return fail(err, i, offset, "the file is not mapped");
        if (fstat(runs[i].fd, &st) < 0) {
            int errnum = errno;
            fail(err, i, offset, "the file cannot be read (%s)", strerror(errnum));
            err->errnum = errnum;
            return -1;
        }
        P->size[i] = st.st_size < (off_t)runs[i].map.len ? st.st_size : (int64_t)runs[i].map.len;
    }
    *size = P->size[i];
    return 0;
}

/* -- key filters (key_filter.py) ------------------------------------------------------------ */
static inline uint64_t mix64(uint64_t z) {  /* SplitMix64's finaliser */
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint64_t key_hash(const Key *k, int text) {
    if (!text)
        return mix64((uint64_t)k->i);
    uint64_t p = 0;
    for (uint64_t i = 0; i < k->n; i++)
        p = p * FILTER_TEXT_MULTIPLIER + (uint64_t)k->s[i] + 1;
    return mix64(p);
}

/* The filter unit a key of hash ``h`` reads for block ``blk`` of run ``i``, and (``index``) its
 * index among the run's units, the seed of its sum; NULL if the run has no filters or this
 * block's do not fit them. */
static const uint8_t *filter_unit(const Run *r, Py_ssize_t blk, uint64_t h, uint64_t *index) {
    if (!r->filters)
        return NULL;
    const uint8_t *at = r->filter_at.buf;
    int64_t lo = ldi64(at + 8 * blk), hi = ldi64(at + 8 * blk + 8);
    if (lo < 0 || hi <= lo || hi > r->filter_bytes.len || (hi - lo) % FILTER_UNIT || lo % FILTER_UNIT)
        return NULL;
    uint64_t units = (uint64_t)(hi - lo) / FILTER_UNIT, unit = ((h >> 32) * units) >> 32;
    *index = (uint64_t)lo / FILTER_UNIT + unit;
    return (const uint8_t *)r->filter_bytes.buf + lo + unit * FILTER_UNIT;
}

/* Whether the key of hash ``h`` may be in the block whose filter unit ``index`` is ``bits``: 0 only
 * if the unit, its sum checked first, says not (a unit that fails its sum is not trusted). */
static int unit_may_hold(const uint8_t *bits, uint64_t index, uint64_t h) {
    if ((uint32_t)XXH3_64bits_withSeed(bits, FILTER_UNIT - FILTER_SUM, index) != ld32(bits + FILTER_UNIT - FILTER_SUM))
        return 1;
    uint64_t second = mix64(h);
    for (int j = 0; j < FILTER_PROBES; j++) {
        unsigned b = (unsigned)((((second >> (9 * j)) & 511) * FILTER_BITS) >> 9);
        if (!((bits[b >> 3] >> (b & 7)) & 1))
            return 0;
    }
    return 1;
}

/* Whether run ``r`` may hold the key of hash ``h``: 0 only if its run filter (NoRebuild runs) says
 * not, as a block's does (a unit that fails its sum is not trusted). */
static int run_may_hold(const Run *r, uint64_t h) {
    if (!r->run_units)
        return 1;
    uint64_t unit = ((h >> 32) * (uint64_t)r->run_units) >> 32;
    return unit_may_hold((const uint8_t *)r->filter_bytes.buf + FILTER_UNIT * (r->run_unit0 + unit), r->run_unit0 + unit, h);
}

/* Asks for the run filter unit of each run the key of hash ``h`` reads (prefetch: the misses overlap). */
static void ask_run_units(const Run *runs, Py_ssize_t nruns, uint64_t h) {
    for (Py_ssize_t i = 0; i < nruns; i++)
        if (runs[i].run_units)
            __builtin_prefetch((const uint8_t *)runs[i].filter_bytes.buf +
                               FILTER_UNIT * (runs[i].run_unit0 + (((h >> 32) * (uint64_t)runs[i].run_units) >> 32)));
}

/* The blocks of run ``r`` whose key range holds ``key``: [*start, *stop) of section ``s``
 * (read_plan.plan's choice, before max_exp and filters); 0 if none. */
static int key_range(const Run *r, Py_ssize_t s, const Key *key, Py_ssize_t *start, Py_ssize_t *stop) {
    Py_ssize_t nblocks = r->blocks.len / ENTRY_BYTES;
    Py_ssize_t a = ldi64((uint8_t *)r->sections.buf + 8 * s), b = ldi64((uint8_t *)r->sections.buf + 8 * s + 8);
    if (a < r->first_live) a = r->first_live;
    if (b > nblocks) b = nblocks;
    if (a >= b)
        return 0;
    *start = bisect(r, 1, a, b, key, 0);
    *stop = bisect(r, 0, a, b, key, 1);
    return *start < *stop;
}

/* A block whose key range holds the key, its entry and filter unit asked for (prefetched). */
typedef struct { Py_ssize_t run, blk; const uint8_t *unit; uint64_t index; } Pending;
#define PENDING 32  /* blocks whose memory is asked for before the first is checked */

/* Fills ``p`` with block ``blk`` of run ``i`` and the filter unit the key of hash ``h`` reads,
 * and asks for both (prefetch: the CPU fetches them while the caller goes on). */
static void ask_pending(Pending *p, const Run *runs, Py_ssize_t i, Py_ssize_t blk, uint64_t h) {
    const uint8_t *entry = (const uint8_t *)runs[i].blocks.buf + ENTRY_BYTES * blk;
    *p = (Pending){.run = i, .blk = blk};
    p->unit = filter_unit(&runs[i], blk, h, &p->index);
    __builtin_prefetch(entry);
    __builtin_prefetch(entry + ENTRY_BYTES - 1);
    if (p->unit != NULL)
        __builtin_prefetch(p->unit);
}

/* Makes each of ``q[0..n)`` that is live at ``as_of`` and whose filter does not rule out the
 * key of hash ``h`` a candidate, in order. */
static int admit(Probe *P, Run *runs, const Pending *q, int n, uint64_t h, int64_t as_of, Py_ssize_t *cap,
                 Error *err) {
    for (int k = 0; k < n; k++) {
        Entry e = entry_at(runs[q[k].run].blocks.buf, q[k].blk);
        if (e.max_exp <= as_of || (q[k].unit != NULL && !unit_may_hold(q[k].unit, q[k].index, h)))
            continue;
        if (grow(&P->cand, P->ncand, cap, sizeof(Candidate), err) < 0)
            return -1;
        P->cand[P->ncand++] = (Candidate){.run = q[k].run, .index = q[k].blk, .e = e};
        P->seen[q[k].run]++;
        P->bytes[q[k].run] += e.length;
    }
    return 0;
}

/* The live blocks of each run whose key range holds ``key`` and whose key filter does not rule it
 * out. A NoRebuild run has a section per expiration slot, each spanning the key range, so a
 * probe would check hundreds of blocks' entries and filter units: its run filter is checked
 * first, so only the runs that may hold the key are searched. Their blocks' entries and filter
 * units, mostly not in the CPU's caches, are asked for PENDING at a time before any is checked,
 * so that the misses overlap. */
static int plan(Probe *P, Run *runs, Py_ssize_t nruns, const Key *key, int64_t as_of, int text, Error *err) {
    Py_ssize_t cap = 0, start, stop;
    uint64_t h = key_hash(key, text);
    Pending q[PENDING];
    int n = 0;
    ask_run_units(runs, nruns, h);
    for (Py_ssize_t i = 0; i < nruns; i++) {
        Run *r = &runs[i];
        if (r->max_exp <= as_of || !run_may_hold(r, h))
            continue;
        for (Py_ssize_t s = 0; s + 1 < r->sections.len / 8; s++) {
            if (!key_range(r, s, key, &start, &stop))
                continue;
            for (Py_ssize_t blk = start; blk < stop; blk++) {
                ask_pending(&q[n++], runs, i, blk, h);
                if (n == PENDING) {
                    if (admit(P, runs, q, n, h, as_of, &cap, err) < 0)
                        return -1;
                    n = 0;
                }
            }
        }
    }
    return admit(P, runs, q, n, h, as_of, &cap, err);
}

/* Asks for bytes [at - half, at + half) of candidate ``C``'s block (clipped to the block). */
static int ahead_near(Probe *P, const Candidate *C, uint64_t at, uint64_t half, Error *err) {
    uint64_t lo = at > half ? at - half : 0, hi = at + half < C->e.length ? at + half : C->e.length;
    return lo < hi ? ahead_add(&P->ahead, &C->b, C->b.p + lo, C->b.p + hi, err) : 0;
}

/* Asks for the pages about row ``C->guess`` of the key column and (``every``) of every other
 * column a probe reads (ts, exp and the returned ones), placed without the block's metadata: from METADATA_GUESS on,
 * column after column, buffers padded to 64 bytes and no validity bitmaps; a variable-width
 * column's data as long as its share of what the other buffers leave of the block (a text key's:
 * its block's first and last keys' mean length a row). With the metadata page in the same
 * request, a cold probe whose guess is near (keys spread about evenly) finds its rows with one
 * round of reads, not one for the key and another for the row. A wrong place costs only reads. */
static int ahead_guessed_rows(Probe *P, const Layout *L, const Candidate *C, int every, const Key *first,
                              const Key *last, Error *err) {
    uint64_t rows = C->e.rows, g = C->guess, used = METADATA_GUESS, key_data = 0;
    int shares = 0;
    for (int c = 0; c < L->ncols; c++) {
        used += (L->kind[c] == FIXED ? (uint64_t)L->width[c] * rows : L->kind[c] == BOOL ? (rows + 7) / 8 : 4 * (rows + 1)) + 64;
        shares += L->kind[c] == VARIABLE && c != L->key;
    }
    if (L->text_key)
        key_data = rows * ((first->n + last->n) / 2);
    uint64_t share = shares && C->e.length > used + key_data ? (C->e.length - used - key_data) / shares : 0;
    uint64_t at = METADATA_GUESS;
    for (int c = 0; c < L->ncols && at < C->e.length; c++) {
        int read = c == L->key || (every && (c < L->nout || c == L->ts || c == L->exp));
        if (L->kind[c] != VARIABLE) {
            uint64_t width = L->kind[c] == FIXED ? (uint64_t)L->width[c] : 0;
            if (read && ahead_near(P, C, at + (width ? width * g : g / 8), PAGE, err) < 0)
                return -1;
            at += (width ? width * rows : (rows + 7) / 8) + 64;
            continue;
        }
        uint64_t data = c == L->key ? key_data : share;
        if (read && (ahead_near(P, C, at + 4 * g, PAGE, err) < 0
                     || (rows && ahead_near(P, C, at + 4 * (rows + 1) + 64 + data * g / rows, 2 * PAGE, err) < 0)))
            return -1;
        at += 4 * (rows + 1) + 64 + data + 64;
    }
    return 0;
}

/* At most this many candidate blocks have their rows' pages asked for with their metadata
 * (``ahead_guessed_rows``): each costs about 80 KiB more in the first read round (about 35 us on
 * the bench machine's disk) and saves the second round (about 65 us) only if the block holds a
 * row valid now. A NoRebuild probe has about 5 candidates, most of them blocks whose filters let
 * the key through for its expired rows (or by chance); a Rebuild probe about 1.4. */
#define GUESS_ROWS_BLOCKS 2

/* Checks that every candidate block lies inside its file as it is now (touching a page past the
 * end of a file would kill the process) and has its page sums, then asks for what a probe of
 * each block reads first, all at once, so that a cold cache reads the blocks of every run in
 * parallel: the metadata page and the pages about where the key should be, with its row's
 * other columns when there are few candidates (``ahead_guessed_rows``). */
static int prepare(Probe *P, Run *runs, const Layout *L, const Key *key, Error *err) {
    for (Py_ssize_t k = 0; k < P->ncand; k++) {
        Candidate *C = &P->cand[k];
        Run *r = &runs[C->run];
        Entry e = C->e;
        int64_t size;
        uint64_t end = e.offset + e.length;
        if (file_size(P, runs, C->run, (int64_t)e.offset, err, &size) < 0)
            return -1;
        if (end > (uint64_t)size)
            return fail(err, C->run, (int64_t)e.offset, "file ends before byte %llu, its descriptor needs it",
                        (unsigned long long)end);
        C->b = (Block){(uint8_t *)r->map.buf + e.offset, e.length, NULL, NULL, C->run, e.offset, err};
        uint64_t head = e.length;
        if (r->have_sums) {
            uint64_t npages = ((uint64_t)e.length + PAGE - 1) / PAGE;
            int64_t p0 = ldi64((uint8_t *)r->page_start.buf + 8 * C->index);
            int64_t p1 = ldi64((uint8_t *)r->page_start.buf + 8 * C->index + 8);
            if (p0 < 0 || p1 - p0 != (int64_t)npages || (uint64_t)p1 * 4 > (uint64_t)r->sums.len)
                return fail(err, C->run, (int64_t)e.offset, "has %lld page sums for %u bytes", (long long)(p1 - p0), e.length);
            C->b.sums = (const uint32_t *)r->sums.buf + p0;
            C->b.checked = calloc(npages ? npages : 1, 1);
            if (C->b.checked == NULL)
                return no_memory(err);
            head = e.length < PAGE ? e.length : PAGE;
        }
        Key first = run_key(r, 0, C->index), last = run_key(r, 1, C->index);
        C->guess = e.rows ? (uint64_t)(spread(&first, &last, key, r->text) * (e.rows - 1)) : 0;
        if (ahead_add(&P->ahead, &C->b, C->b.p, C->b.p + head, err) < 0
            || (head < e.length && ahead_guessed_rows(P, L, C, P->ncand <= GUESS_ROWS_BLOCKS, &first, &last, err) < 0))
            return -1;
    }
    advise(P, 1);
    return 0;
}

/* Where rows [a, z) of ``rows`` have their strings in variable-width column ``col``, guessed
 * before their offsets are read: their share of the column's data (``ahead_add`` widens it to
 * block pages; a miss is asked for by ``ahead_strings``, not with a margin on every block). */
static void strings_guess(const Column *col, uint64_t a, uint64_t z, uint64_t rows, uint64_t *lo, uint64_t *hi) {
    uint64_t at = rows ? col->data_len * a / rows : 0, to = rows ? col->data_len * z / rows : 0;
    *lo = at;
    *hi = to < col->data_len ? to : col->data_len;
}

/* -- work shared between threads ----------------------------------------------------------------- */
/* A probe of many blocks (thesis-small's keys have rows in hundreds) hashes megabytes of pages;
 * each block's search and checks are independent of the others', so those of a probe with at
 * least PARALLEL_BLOCKS candidates are shared by up to ``probe_threads`` threads (the caller's
 * and helpers started for the phase), each taking the next block as it finishes one. A probe of
 * a few blocks (a key-value lookup) stays on the caller's thread: starting a thread costs more. */
#define PARALLEL_BLOCKS 32
#define MAX_PROBE_THREADS 8
static int probe_threads = 1;  /* set at import: the CPUs this process may run on, at most 4, or EBB_PROBE_THREADS */

/* One phase's work over candidates [0, n): ``one(ctx, k, ahead, err)`` for each k. */
typedef int (*BlockWork)(void *ctx, Py_ssize_t k, Ahead *ahead, Error *err);
typedef struct Shared Shared;
typedef struct { Shared *s; Ahead ahead; Error err; Py_ssize_t failed; } Worker;  /* failed: the block, or -1 */
struct Shared { BlockWork one; void *ctx; Py_ssize_t n, next; int stop; };

static void *work(void *arg) {
    Worker *w = arg;
    Shared *s = w->s;
    for (;;) {
        if (__atomic_load_n(&s->stop, __ATOMIC_RELAXED))
            break;
        Py_ssize_t k = __atomic_fetch_add(&s->next, 1, __ATOMIC_RELAXED);
        if (k >= s->n)
            break;
        if (s->one(s->ctx, k, &w->ahead, &w->err) < 0) {
            w->failed = k;
            __atomic_store_n(&s->stop, 1, __ATOMIC_RELAXED);
            break;
        }
    }
    return NULL;
}

/* Runs ``one`` for every candidate of ``P``, on the caller's thread alone or shared (above). The
 * ranges the workers ask for are added to the probe's; the error is that of the first block that
 * failed, as one thread would have met it, so a damaged archive fails the same way each time. */
static int each_candidate(Probe *P, BlockWork one, void *ctx, Error *err) {
    int threads = P->ncand >= PARALLEL_BLOCKS ? probe_threads : 1;
    if (threads <= 1) {
        for (Py_ssize_t k = 0; k < P->ncand; k++)
            if (one(ctx, k, &P->ahead, err) < 0)
                return -1;
        return 0;
    }
    Shared s = {one, ctx, P->ncand, 0, 0};
    Worker w[MAX_PROBE_THREADS];
    pthread_t helper[MAX_PROBE_THREADS];
    int started = 0, rc = 0;
    for (int t = 0; t < threads; t++)
        w[t] = (Worker){.s = &s, .failed = -1};
    for (int t = 1; t < threads; t++, started++)
        if (pthread_create(&helper[t], NULL, work, &w[t]) != 0)
            break;  /* fewer helpers: the work is shared by those there are */
    work(&w[0]);
    for (int t = 1; t <= started; t++)
        pthread_join(helper[t], NULL);
    Py_ssize_t first = -1;
    int by = 0;
    for (int t = 0; t <= started; t++)
        if (w[t].failed >= 0 && (first < 0 || w[t].failed < first))
            first = w[t].failed, by = t;
    if (first >= 0) {
        *err = w[by].err;
        rc = -1;
    }
    for (int t = 0; t <= started; t++) {
        for (Py_ssize_t i = 0; rc == 0 && i < w[t].ahead.n; i++) {
            if (grow(&P->ahead.v, P->ahead.n, &P->ahead.cap, sizeof(struct iovec), err) < 0)
                rc = -1;
            else
                P->ahead.v[P->ahead.n++] = w[t].ahead.v[i];
        }
        if (w[t].ahead.longest > P->ahead.longest)
            P->ahead.longest = w[t].ahead.longest;
        free(w[t].ahead.v);
    }
    for (Py_ssize_t k = 0; k < P->ncand; k++)
        P->cand[k].b.err = err;  /* not a worker's, gone with this frame */
    return rc;
}

/* Decodes each candidate block in place and finds the key's rows in it (a block without page sums
 * is checked whole first). Then asks, for all blocks at once, for the found rows of every other
 * returned column, or for the whole block if most of it is asked for. */
typedef struct { Probe *P; const Layout *L; const Key *key; } SearchWork;

static int search_block(void *ctx, Py_ssize_t k, Ahead *ahead, Error *err) {
    const SearchWork *sw = ctx;
    const Layout *L = sw->L;
    Candidate *C = &sw->P->cand[k];
    Block *b = &C->b;
    b->err = err;  /* this thread's */
    if (b->sums == NULL && page_hash(b->p, b->len) != C->e.checksum)
        return fail(err, b->run, (int64_t)C->e.offset, "fails its checksum");
    C->cols = calloc(L->ncols, sizeof(Column));
    if (C->cols == NULL)
        return no_memory(err);
    if (decode(b, L, C->e.rows, C->cols) < 0 || key_rows(b, L, C->cols, C->e.rows, sw->key, C->guess, &C->a, &C->z) < 0)
        return -1;
    if (b->sums != NULL && 4 * (C->z - C->a) > C->e.rows) {  /* one request and one hash, as task_reader does */
        C->whole = 1;
        return ahead_add(ahead, b, b->p, b->p + b->len, err);
    }
    for (int c = 0; c < L->nout && C->z > C->a && b->sums != NULL; c++) {
        const Column *col = &C->cols[c];
        uint64_t a = C->a, z = C->z, rows = C->e.rows;
        if (c == L->key)
            continue;  /* the search has read these */
        if (col->validity && ahead_add(ahead, b, col->validity + a / 8, col->validity + (z + 7) / 8, err) < 0)
            return -1;
        int r;
        if (L->kind[c] == FIXED)
            r = ahead_add(ahead, b, col->values + (uint64_t)L->width[c] * a, col->values + (uint64_t)L->width[c] * z, err);
        else if (L->kind[c] == BOOL)
            r = ahead_add(ahead, b, col->values + a / 8, col->values + (z + 7) / 8, err);
        else {  /* the offsets, and about where the rows' strings are (known once the offsets are read) */
            uint64_t lo, hi;
            strings_guess(col, a, z, rows, &lo, &hi);
            r = ahead_add(ahead, b, col->values + 4 * a, col->values + 4 * (z + 1), err);
            if (r == 0 && lo < hi)
                r = ahead_add(ahead, b, col->data + lo, col->data + hi, err);
        }
        if (r < 0)
            return -1;
    }
    return 0;
}

static int search_blocks(Probe *P, const Layout *L, const Key *key, Error *err) {
    SearchWork sw = {P, L, key};
    if (each_candidate(P, search_block, &sw, err) < 0)
        return -1;
    advise(P, 0);
    return 0;
}

/* On a cold cache, asks at once for the found rows' strings, of every returned variable-width
 * column, that lie outside what search_blocks guessed (``strings_guess``), now that their offsets
 * are read: the guess misses pages where lengths vary, and each page missed would be a read of
 * its own. The offsets are not checked yet (collect does), so they are only trusted to stay
 * inside the column's data. */
static int ahead_strings(Probe *P, const Layout *L, Error *err) {
    if (!P->advise || P->warm)
        return 0;
    for (Py_ssize_t k = 0; k < P->ncand; k++) {
        const Candidate *C = &P->cand[k];
        if (C->whole || C->z <= C->a || C->b.sums == NULL)
            continue;
        for (int c = 0; c < L->nout; c++) {
            const Column *col = &C->cols[c];
            if (L->kind[c] != VARIABLE || c == L->key)
                continue;
            int32_t lo = ldi32(col->values + 4 * C->a), hi = ldi32(col->values + 4 * C->z);
            uint64_t guess_lo, guess_hi;
            strings_guess(col, C->a, C->z, C->e.rows, &guess_lo, &guess_hi);
            if (lo >= 0 && hi > lo && (uint64_t)hi <= col->data_len && ((uint64_t)lo < guess_lo || (uint64_t)hi > guess_hi)
                && ahead_add(&P->ahead, &C->b, col->data + lo, col->data + hi, err) < 0)
                return -1;
        }
    }
    advise(P, 0);
    return 0;
}

/* Checks the found rows of every returned column of candidate ``k`` (or the whole block, against
 * its checksum). */
static int check_block(void *ctx, Py_ssize_t k, Ahead *ahead, Error *err) {
    (void)ahead;
    const SearchWork *sw = ctx;
    const Layout *L = sw->L;
    Candidate *C = &sw->P->cand[k];
    C->b.err = err;  /* this thread's */
    if (C->whole) {
        if (page_hash(C->b.p, C->b.len) != C->e.checksum)
            return fail(err, C->run, (int64_t)C->e.offset, "fails its checksum");
        C->b.sums = NULL;  /* every page is checked now */
    }
    for (int c = 0; c < L->nout && C->z > C->a; c++)
        if (check_rows(&C->b, L, &C->cols[c], c, C->a, C->z) < 0)
            return -1;
    return 0;
}

/* Checks the found rows of every block, then keeps those valid at ``as_of``, ordered. */
static int collect(Probe *P, const Layout *L, int64_t as_of, Error *err) {
    SearchWork sw = {P, L, NULL};
    Py_ssize_t cap = 0;
    if (each_candidate(P, check_block, &sw, err) < 0)
        return -1;
    for (Py_ssize_t k = 0; k < P->ncand; k++) {
        Candidate *C = &P->cand[k];
        for (uint64_t row = C->a; row < C->z; row++) {
            int64_t ts = ldi64(C->cols[L->ts].values + 8 * row), exp = ldi64(C->cols[L->exp].values + 8 * row);
            if (!(ts <= as_of && as_of < exp))
                continue;
            if (grow(&P->rows, P->nrows, &cap, sizeof(Row), err) < 0)
                return -1;
            P->rows[P->nrows] = (Row){k, (Py_ssize_t)row, P->nrows, 0, exp, ts};
            P->nrows++;
        }
    }
    if (P->nrows > 1)  /* one key: (key, exp, ts) order is (exp, ts) order */
        qsort(P->rows, P->nrows, sizeof(Row), compare_rows);
    return 0;
}

/* -- batch probes: many keys in one call -------------------------------------------------------- */
/* A batch searches each key as a single probe does, in the blocks read_plan.plan would choose for
 * it, but decodes each block and checks each page once for all the keys it holds: a block is a
 * candidate the first time a key needs it (``slot``), and its ``checked`` pages stay checked for
 * the rest of the call. With several keys a block on average, each block is advised whole as it
 * is first needed (on a cold cache, one read of it); with fewer, a key reads a page or two. */
typedef struct {
    Probe P;
    Py_ssize_t cap;
    Py_ssize_t **slot;  /* per run: candidate index + 1 of each block (0: not a candidate yet) */
    int advise;         /* enough keys that a block is mostly read: ask for each block whole */
} Batch;

static void free_batch(Batch *B, Py_ssize_t nruns) {
    for (Py_ssize_t i = 0; i < nruns; i++) {
        if (B->slot != NULL)
            free(B->slot[i]);
    }
    free(B->slot);
    free_probe(&B->P);
}

/* The candidate of block ``blk`` of run ``i``, checked against its file and decoded (once). */
static int batch_block(Batch *B, Run *runs, Py_ssize_t i, Py_ssize_t blk, const Layout *L, Error *err, Candidate **out) {
    Probe *P = &B->P;
    Run *r = &runs[i];
    if (B->slot[i] == NULL && (B->slot[i] = calloc(r->blocks.len / ENTRY_BYTES + 1, sizeof(Py_ssize_t))) == NULL)
        return no_memory(err);
    if (B->slot[i][blk]) {
        *out = &P->cand[B->slot[i][blk] - 1];
        return 0;
    }
    Entry e = entry_at(r->blocks.buf, blk);
    uint64_t end = e.offset + e.length;
    int64_t size;
    if (file_size(P, runs, i, (int64_t)e.offset, err, &size) < 0)
        return -1;
    if (end > (uint64_t)size)
        return fail(err, i, (int64_t)e.offset, "file ends before byte %llu, its descriptor needs it", (unsigned long long)end);
    if (grow(&P->cand, P->ncand, &B->cap, sizeof(Candidate), err) < 0)
        return -1;
    Candidate *C = &P->cand[P->ncand++];
    *C = (Candidate){.run = i, .index = blk, .e = e};
    B->slot[i][blk] = P->ncand;
    P->seen[i]++;
    P->bytes[i] += e.length;
    C->b = (Block){(uint8_t *)r->map.buf + e.offset, e.length, NULL, NULL, i, e.offset, err};
    if (B->advise) {
        if (ahead_add(&P->ahead, &C->b, C->b.p, C->b.p + e.length, err) < 0)
            return -1;
        advise(P, 1);  /* each block is its own first round */
    }
    if (r->have_sums) {
        uint64_t npages = ((uint64_t)e.length + PAGE - 1) / PAGE;
        int64_t p0 = ldi64((uint8_t *)r->page_start.buf + 8 * blk), p1 = ldi64((uint8_t *)r->page_start.buf + 8 * blk + 8);
        if (p0 < 0 || p1 - p0 != (int64_t)npages || (uint64_t)p1 * 4 > (uint64_t)r->sums.len)
            return fail(err, i, (int64_t)e.offset, "has %lld page sums for %u bytes", (long long)(p1 - p0), e.length);
        C->b.sums = (const uint32_t *)r->sums.buf + p0;
        if ((C->b.checked = calloc(npages ? npages : 1, 1)) == NULL)
            return no_memory(err);
    } else if (page_hash(C->b.p, C->b.len) != e.checksum)
        return fail(err, i, (int64_t)e.offset, "fails its checksum");
    if ((C->cols = calloc(L->ncols, sizeof(Column))) == NULL)
        return no_memory(err);
    if (decode(&C->b, L, e.rows, C->cols) < 0)
        return -1;
    *out = C;
    return 0;
}

/* The rows of key ``k`` (``key``, of hash ``h``) valid at ``as_of`` in the blocks ``q[0..n)`` that
 * are live and whose filter does not rule the key out, appended to the batch's rows. */
static int batch_admit(Batch *B, Run *runs, const Pending *q, int n, const Layout *L, const Key *key, Py_ssize_t k,
                       uint64_t h, int64_t as_of, Py_ssize_t *row_cap, Error *err) {
    Probe *P = &B->P;
    for (int j = 0; j < n; j++) {
        Run *r = &runs[q[j].run];
        Py_ssize_t blk = q[j].blk;
        Candidate *C = NULL;
        if (entry_at(r->blocks.buf, blk).max_exp <= as_of || (q[j].unit != NULL && !unit_may_hold(q[j].unit, q[j].index, h)))
            continue;
        if (batch_block(B, runs, q[j].run, blk, L, err, &C) < 0)
            return -1;
        Key first = run_key(r, 0, blk), last = run_key(r, 1, blk);
        uint64_t guess = C->e.rows ? (uint64_t)(spread(&first, &last, key, r->text) * (C->e.rows - 1)) : 0, lo, hi;
        if (key_rows(&C->b, L, C->cols, C->e.rows, key, guess, &lo, &hi) < 0)
            return -1;
        for (int c = 0; c < L->nout && hi > lo; c++)
            if (check_rows(&C->b, L, &C->cols[c], c, lo, hi) < 0)
                return -1;
        for (uint64_t row = lo; row < hi; row++) {
            int64_t ts = ldi64(C->cols[L->ts].values + 8 * row), exp = ldi64(C->cols[L->exp].values + 8 * row);
            if (!(ts <= as_of && as_of < exp))
                continue;
            if (grow(&P->rows, P->nrows, row_cap, sizeof(Row), err) < 0)
                return -1;
            P->rows[P->nrows] = (Row){C - P->cand, (Py_ssize_t)row, P->nrows, k, exp, ts};
            P->nrows++;
        }
    }
    return 0;
}

/* The rows of key ``keys[k]`` valid at ``as_of`` in every run, appended to the batch's rows with
 * ``key`` = k (their order among the keys). The blocks' entries and filter units are asked for
 * PENDING at a time before any is checked, as ``plan`` does. */
static int batch_key(Batch *B, Run *runs, Py_ssize_t nruns, const Layout *L, const Key *key, Py_ssize_t k, int64_t as_of,
                     Py_ssize_t *row_cap, Error *err) {
    uint64_t h = key_hash(key, L->text_key);
    Pending q[PENDING];
    int n = 0;
    Py_ssize_t start, stop;
    ask_run_units(runs, nruns, h);
    for (Py_ssize_t i = 0; i < nruns; i++) {
        Run *r = &runs[i];
        if (r->max_exp <= as_of || !run_may_hold(r, h))
            continue;
        for (Py_ssize_t s = 0; s + 1 < r->sections.len / 8; s++) {
            if (!key_range(r, s, key, &start, &stop))
                continue;
            for (Py_ssize_t blk = start; blk < stop; blk++) {
                ask_pending(&q[n++], runs, i, blk, h);
                if (n == PENDING) {
                    if (batch_admit(B, runs, q, n, L, key, k, h, as_of, row_cap, err) < 0)
                        return -1;
                    n = 0;
                }
            }
        }
    }
    return batch_admit(B, runs, q, n, L, key, k, h, as_of, row_cap, err);
}

/* A batch's keys: ``n`` int64 at ``ints``, or (text) ``n`` strings of ``data`` between int64 ``offsets``. */
typedef struct { Py_ssize_t n; const uint8_t *ints, *offsets, *data; } Keys;

static inline Key key_of(const Keys *keys, Py_ssize_t k) {
    Key key = {0};
    if (keys->ints != NULL) {
        key.i = ldi64(keys->ints + 8 * k);
    } else {
        int64_t lo = ldi64(keys->offsets + 8 * k), hi = ldi64(keys->offsets + 8 * k + 8);
        key.s = keys->data + lo;
        key.n = (uint64_t)(hi - lo);
    }
    return key;
}

/* Every key of ``keys`` (ascending) searched in turn; the rows ordered by (key, exp, ts). */
static int batch_probe(Batch *B, Run *runs, Py_ssize_t nruns, const Layout *L, const Keys *keys, int64_t as_of,
                       Error *err) {
    Py_ssize_t row_cap = 0, blocks = 0;
    for (Py_ssize_t i = 0; i < nruns; i++)
        blocks += runs[i].blocks.len / ENTRY_BYTES;
    B->advise = keys->n >= 4 * blocks;
    for (Py_ssize_t k = 0; k < keys->n; k++) {
        Key key = key_of(keys, k);
        if (batch_key(B, runs, nruns, L, &key, k, as_of, &row_cap, err) < 0)
            return -1;
    }
    if (B->P.nrows > 1)
        qsort(B->P.rows, B->P.nrows, sizeof(Row), compare_rows);
    return 0;
}

/* -- output: an Arrow C data interface record batch ---------------------------------------------- */
struct ArrowArray {  /* as the Arrow C data interface defines it */
    int64_t length, null_count, offset, n_buffers, n_children;
    const void **buffers;
    struct ArrowArray **children, *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

static void release_child(struct ArrowArray *a) { a->release = NULL; }  /* freed with its parent */

/* A batch's memory: one allocation holds the structs and every buffer, after a header giving its
 * size. The last large one released is kept (``spare``) for the next batch it can hold: a fresh
 * allocation of megabytes is mapped by the C library anew (it trims its heap once an update has
 * freed a lot), and the first touch of each of its pages is a page fault that zeroes the page: in
 * the thesis-small workload, about 1,200 faults in the first probe of each version (a 5 MB answer),
 * a third of its time. Holds at most SPARE_MAX bytes of anonymous memory a process. */
static inline uint64_t align64(uint64_t n) { return (n + 63) & ~(uint64_t)63; }
#define OUT_HEADER 64      /* keeps the batch 64-byte aligned, as Arrow wants */
#define SPARE_MIN (256 << 10)  /* below this the C library's heap serves allocations */
#define SPARE_MAX (64 << 20)
static struct { uint8_t *mem; uint64_t size; pthread_mutex_t lock; } spare = {NULL, 0, PTHREAD_MUTEX_INITIALIZER};

/* Memory for a batch of ``size`` bytes (64-byte aligned), the spare one if it is large enough. */
static uint8_t *batch_memory(uint64_t size) {
    uint8_t *mem = NULL;
    pthread_mutex_lock(&spare.lock);
    if (size >= SPARE_MIN && spare.mem != NULL && spare.size >= size) {
        mem = spare.mem;
        spare.mem = NULL;
    }
    pthread_mutex_unlock(&spare.lock);
    if (mem != NULL)
        return mem + OUT_HEADER;
    size = size < SPARE_MIN ? size : size + size / 4;  /* a little room, so the next, larger batch fits too */
    if ((mem = aligned_alloc(64, align64(size) + OUT_HEADER)) == NULL)
        return NULL;
    memcpy(mem, &size, sizeof size);
    return mem + OUT_HEADER;
}

/* A forked child (Spark's workers) starts with the lock free, whichever thread held it in the parent. */
static void spare_forked(void) { pthread_mutex_init(&spare.lock, NULL); }

static void release_batch(struct ArrowArray *a) {
    uint8_t *mem = (uint8_t *)a->private_data - OUT_HEADER;
    uint64_t size;
    memcpy(&size, mem, sizeof size);
    a->release = NULL;
    if (size >= SPARE_MIN && size <= SPARE_MAX) {
        pthread_mutex_lock(&spare.lock);
        if (spare.mem == NULL || spare.size < size) {  /* keep the larger */
            uint8_t *old = spare.mem;
            spare.mem = mem, spare.size = size, mem = old;
        }
        pthread_mutex_unlock(&spare.lock);
    }
    free(mem);
}

/* The PyCapsule ("arrow_array") a probe returns: it owns a copy of the batch's top-level struct,
 * which pyarrow moves out on import (setting this one's release to NULL); a capsule dropped
 * unimported releases the batch. The copy lives apart from the batch's memory, which the
 * importer may free before the capsule goes. */
static const char ARROW_ARRAY[] = "arrow_array";

static void release_capsule(PyObject *capsule) {
    struct ArrowArray *a = PyCapsule_GetPointer(capsule, ARROW_ARRAY);
    if (a == NULL)
        return;
    if (a->release != NULL)
        a->release(a);
    free(a);
}

static PyObject *batch_capsule(struct ArrowArray *batch) {
    struct ArrowArray *a = malloc(sizeof *a);
    if (a == NULL) {
        release_batch(batch);
        return PyErr_NoMemory();
    }
    *a = *batch;
    PyObject *capsule = PyCapsule_New(a, ARROW_ARRAY, release_capsule);
    if (capsule == NULL) {
        release_batch(a);
        free(a);
    }
    return capsule;
}

static inline int bit(const uint8_t *bits, Py_ssize_t i) { return (bits[i >> 3] >> (i & 7)) & 1; }

/* Bytes of column ``c``'s validity (0: no nulls), values (or offsets) and string data for ``rows``. */
static void sizes(const Layout *L, int c, const Candidate *cand, const Row *rows, Py_ssize_t n, uint64_t size[3],
                  int64_t *nulls) {
    *nulls = 0;
    size[2] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const Column *col = &cand[rows[i].block].cols[c];
        *nulls += col->validity && !bit(col->validity, rows[i].row);
        if (L->kind[c] == VARIABLE)
            size[2] += (uint64_t)(ldi32(col->values + 4 * rows[i].row + 4) - ldi32(col->values + 4 * rows[i].row));
    }
    size[0] = *nulls ? ((uint64_t)n + 7) / 8 : 0;
    size[1] = L->kind[c] == FIXED ? (uint64_t)n * L->width[c] : L->kind[c] == BOOL ? ((uint64_t)n + 7) / 8 : 4 * ((uint64_t)n + 1);
}

/* Copies column ``c`` of ``rows`` into ``buf`` (validity, values or offsets, data; sized by ``sizes``). */
static void gather(const Layout *L, int c, const Candidate *cand, const Row *rows, Py_ssize_t n, uint8_t *buf[3]) {
    if (buf[0] != NULL) {
        memset(buf[0], 0, ((uint64_t)n + 7) / 8);
        for (Py_ssize_t i = 0; i < n; i++) {
            const Column *col = &cand[rows[i].block].cols[c];
            if (!col->validity || bit(col->validity, rows[i].row))
                buf[0][i >> 3] |= (uint8_t)(1 << (i & 7));
        }
    }
    if (L->kind[c] == FIXED) {
        /* one row at a time: the rows come from many blocks; a load and a store for the common
         * widths, where a memcpy of a width known only here is a call per row */
        Py_ssize_t w = L->width[c];
        if (w == 8)
            for (Py_ssize_t i = 0; i < n; i++)
                memcpy(buf[1] + 8 * i, cand[rows[i].block].cols[c].values + rows[i].row * 8, 8);
        else if (w == 4)
            for (Py_ssize_t i = 0; i < n; i++)
                memcpy(buf[1] + 4 * i, cand[rows[i].block].cols[c].values + rows[i].row * 4, 4);
        else
            for (Py_ssize_t i = 0; i < n; i++)
                memcpy(buf[1] + i * w, cand[rows[i].block].cols[c].values + rows[i].row * w, w);
    } else if (L->kind[c] == BOOL) {
        memset(buf[1], 0, ((uint64_t)n + 7) / 8);
        for (Py_ssize_t i = 0; i < n; i++)
            if (bit(cand[rows[i].block].cols[c].values, rows[i].row))
                buf[1][i >> 3] |= (uint8_t)(1 << (i & 7));
    } else {
        /* the offsets row by row; the data in one copy for each stretch of rows that follow one
         * another in one block (a key's rows of one expiration slot often do) */
        int32_t at = 0, copied = 0;  /* data written so far; of it, copied already */
        const uint8_t *src = NULL;
        memcpy(buf[1], &at, 4);
        for (Py_ssize_t i = 0; i < n; i++) {
            const Column *col = &cand[rows[i].block].cols[c];
            int32_t lo = ldi32(col->values + 4 * rows[i].row), hi = ldi32(col->values + 4 * rows[i].row + 4);
            if (src == NULL || col->data + lo != src + (at - copied)) {  /* not where the stretch ends */
                if (at > copied)
                    memcpy(buf[2] + copied, src, (size_t)(at - copied));
                src = col->data + lo, copied = at;
            }
            at += hi - lo;
            memcpy(buf[1] + 4 * (i + 1), &at, 4);
        }
        if (at > copied)
            memcpy(buf[2] + copied, src, (size_t)(at - copied));
    }
}

/* The returned columns of ``rows`` as a record batch in one allocation, or NULL (a Python
 * exception set: called with the GIL held). */
static struct ArrowArray *batch(const Layout *L, const Candidate *cand, const Row *rows, Py_ssize_t n) {
    int nc = L->nout;
    uint64_t total = align64(sizeof(struct ArrowArray) * (1 + (uint64_t)nc) + sizeof(void *) * (1 + 4 * (uint64_t)nc));
    uint64_t (*size)[3] = malloc(sizeof *size * (nc ? nc : 1));  /* each column's, from one pass over the rows */
    int64_t *nulls = malloc(sizeof *nulls * (nc ? nc : 1));
    if (size == NULL || nulls == NULL) {
        free(size), free(nulls);
        PyErr_NoMemory();
        return NULL;
    }
    for (int c = 0; c < nc; c++) {
        sizes(L, c, cand, rows, n, size[c], &nulls[c]);
        if (size[c][2] > INT32_MAX) {
            free(size), free(nulls);
            PyErr_SetString(PyExc_OverflowError, "a probe's result is too large for one string column");
            return NULL;
        }
        total += align64(size[c][0]) + align64(size[c][1]) + align64(size[c][2]);
    }
    uint8_t *mem = batch_memory(total);
    if (mem == NULL) {
        free(size), free(nulls);
        PyErr_NoMemory();
        return NULL;
    }
    struct ArrowArray *top = (struct ArrowArray *)mem, *kids = top + 1;
    struct ArrowArray **kid_ptrs = (struct ArrowArray **)(kids + nc);
    const void **bufs = (const void **)(kid_ptrs + nc);  /* the batch's one (absent) buffer, then 3 a column */
    uint8_t *at = mem + align64(sizeof(struct ArrowArray) * (1 + (uint64_t)nc) + sizeof(void *) * (1 + 4 * (uint64_t)nc));
    bufs[0] = NULL;
    *top = (struct ArrowArray){n, 0, 0, 1, nc, bufs, kid_ptrs, NULL, release_batch, mem};
    for (int c = 0; c < nc; c++) {
        uint8_t *b[3];
        for (int k = 0; k < 3; k++) {
            b[k] = k == 0 && !nulls[c] ? NULL : at;
            at += align64(size[c][k]);
        }
        gather(L, c, cand, rows, n, b);
        const void **cb = bufs + 1 + 3 * c;
        cb[0] = b[0], cb[1] = b[1], cb[2] = b[2];
        kid_ptrs[c] = &kids[c];
        kids[c] = (struct ArrowArray){n, nulls[c], 0, L->kind[c] == VARIABLE ? 3 : 2, 0, cb, NULL, NULL, release_child, NULL};
    }
    free(size), free(nulls);
    return top;
}

/* -- the module's functions --------------------------------------------------------------------- */
#define RUN "ebb.point_probe.Run"

static void destroy_run(PyObject *capsule) {
    Run *r = PyCapsule_GetPointer(capsule, RUN);
    release_run(r);
    PyMem_Free(r);
}

/* Whether int64 offsets ``at`` ascend from 0 to ``len``. */
static int offsets_fit(const Py_buffer *at, Py_ssize_t len) {
    Py_ssize_t n = at->len / 8;
    const uint8_t *v = at->buf;
    if (n < 1 || ldi64(v) != 0 || ldi64(v + 8 * (n - 1)) != len)
        return 0;
    for (Py_ssize_t i = 1; i < n; i++)
        if (ldi64(v + 8 * i) < ldi64(v + 8 * (i - 1)))
            return 0;
    return 1;
}

/* An int64 array of ``n`` items as a new bytes object (NULL with an exception). */
static PyObject *int64_bytes(Py_ssize_t n, int64_t **items) {
    PyObject *b = PyBytes_FromStringAndSize(NULL, 8 * n);
    if (b != NULL)
        *items = (int64_t *)PyBytes_AS_STRING(b);
    return b;
}

/* What a run's probes derive from its blocks' entries, computed in one pass when a reader first
 * prepares the run (a new run's first probe pays for it): see the method table. */
static PyObject *block_arrays(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer blocks;
    int bits;
    if (!PyArg_ParseTuple(args, "y*i", &blocks, &bits))
        return NULL;
    PyObject *sections = NULL, *pages = NULL, *filters = NULL, *out = NULL;
    Py_ssize_t n = blocks.len / ENTRY_BYTES, nsec = 0;
    const uint8_t *b = blocks.buf;
    int64_t *sec, *pg, *fl = NULL;
    if (blocks.len % ENTRY_BYTES || bits < 0 || bits > FILTER_BITS) {
        PyErr_SetString(PyExc_ValueError, "blocks must be BLOCK entries, bits at most a unit's");
        goto done;
    }
    if ((sections = int64_bytes(n + 1, &sec)) == NULL || (pages = int64_bytes(n + 1, &pg)) == NULL ||
        (bits && (filters = int64_bytes(n + 1, &fl)) == NULL))
        goto done;
    pg[0] = 0;
    if (fl != NULL)
        fl[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t *e = b + i * ENTRY_BYTES;
        if (i == 0 || ldi64(e + E_SLOT) != ldi64(e - ENTRY_BYTES + E_SLOT))
            sec[nsec++] = i;
        pg[i + 1] = pg[i] + ((int64_t)ld32(e + E_LENGTH) + PAGE - 1) / PAGE;
        if (fl != NULL) {
            int64_t units = ((int64_t)ld32(e + E_ROWS) * bits + FILTER_BITS - 1) / FILTER_BITS;
            fl[i + 1] = fl[i] + FILTER_UNIT * (units > 1 ? units : 1);
        }
    }
    sec[nsec++] = n;
    if (_PyBytes_Resize(&sections, 8 * nsec) < 0)  /* frees it and sets it to NULL on failure */
        goto done;
    out = Py_BuildValue("(NNN)", sections, pages, filters != NULL ? filters : Py_NewRef(Py_None));
    sections = pages = filters = NULL;  /* the tuple took them (or Py_BuildValue freed them) */
done:
    Py_XDECREF(sections);
    Py_XDECREF(pages);
    Py_XDECREF(filters);
    PyBuffer_Release(&blocks);
    return out;
}

/* Where a run's blocks end and how many page sums they have: what a sealed descriptor's parse
 * checks its parts against (run_descriptor.parse_sealed), without numpy's calls on each new run. */
static PyObject *block_extent(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer blocks;
    if (PyObject_GetBuffer(arg, &blocks, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = blocks.len / ENTRY_BYTES;
    const uint8_t *b = blocks.buf;
    uint64_t end = 0, pages = 0;
    if (blocks.len % ENTRY_BYTES) {
        PyErr_SetString(PyExc_ValueError, "blocks must be BLOCK entries");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        pages += ((uint64_t)ld32(b + i * ENTRY_BYTES + E_LENGTH) + PAGE - 1) / PAGE;
    if (n)
        end = ld64(b + (n - 1) * ENTRY_BYTES + E_OFFSET) + ld32(b + (n - 1) * ENTRY_BYTES + E_LENGTH);
    out = Py_BuildValue("(KK)", (unsigned long long)end, (unsigned long long)pages);
done:
    PyBuffer_Release(&blocks);
    return out;
}

/* One run's map and arrays, checked against each other and held (exported) for as long as the
 * capsule lives: every version that keeps the run reuses it, so a new version's run set costs a
 * copy a run, not an export of each of its buffers. */
static PyObject *prepared_run(PyObject *self, PyObject *args) {
    (void)self;
    Run *r = PyMem_Calloc(1, sizeof(Run));
    if (r == NULL)
        return PyErr_NoMemory();
    if (open_run(args, r) < 0)
        goto fail;
    Py_ssize_t nb = r->blocks.len / ENTRY_BYTES;
    int keys_ok = !r->text ? r->first.len == 8 * nb && r->last.len == 8 * nb
                : r->first_at.len == 8 * (nb + 1) && r->last_at.len == 8 * (nb + 1) &&
                  offsets_fit(&r->first_at, r->first.len) && offsets_fit(&r->last_at, r->last.len);
    if (r->filters && r->filter_at.len != 8 * (nb + 1))
        keys_ok = 0;
    if (!r->filters || !keys_ok || r->run_units < 0 || r->run_units > (1 << 30)) {
        r->run_units = 0;
    } else if (r->run_units) {  /* it follows the blocks' filters and ends them; elsewhere: not used (searched) */
        int64_t at = ldi64((const uint8_t *)r->filter_at.buf + 8 * nb);
        if (at < 0 || at % FILTER_UNIT || at + (int64_t)r->run_units * FILTER_UNIT != (int64_t)r->filter_bytes.len)
            r->run_units = 0;
        else
            r->run_unit0 = (uint64_t)at / FILTER_UNIT;
    }
    if (r->blocks.len != nb * ENTRY_BYTES || !keys_ok || r->page_start.len != 8 * (nb + 1) || r->sections.len % 8) {
        PyErr_SetString(PyExc_ValueError, "run arrays disagree");
        goto fail;
    }
    PyObject *capsule = PyCapsule_New(r, RUN, destroy_run);
    if (capsule != NULL)
        return capsule;
fail:
    release_run(r);
    PyMem_Free(r);
    return NULL;
}

/* The runs of one version and the schema's layout: copies of its runs' prepared structs, whose
 * capsules (``handles``) it holds, so that every array and map stays exported for as long as
 * the set lives: a probe then parses nothing. */
typedef struct {
    Run *runs;
    Py_ssize_t nruns;
    PyObject *handles;  /* a tuple of the runs' capsules */
    Layout L;
    Py_buffer kind_buf, width_buf;
    /* whether the set's last probe met a cold cache (or none has run yet): the next one advises.
     * A probe that advises and finds its first page in memory clears it; one that takes longer
     * than COLD_PROBE_NS (a disk read) sets it. Shared by threads: a hint, races are harmless. */
    volatile int cold;
} RunSet;

#define COLD_PROBE_NS 50000

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

#define RUNSET "ebb.point_probe.RunSet"

static void free_runset(RunSet *S) {
    PyMem_Free(S->runs);  /* copies: the buffers are the handles' */
    Py_XDECREF(S->handles);
    if (S->kind_buf.obj) PyBuffer_Release(&S->kind_buf);
    if (S->width_buf.obj) PyBuffer_Release(&S->width_buf);
    PyMem_Free(S);
}

static void destroy_runset(PyObject *capsule) { free_runset(PyCapsule_GetPointer(capsule, RUNSET)); }

static PyObject *run_set(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *runs_obj, *live_obj, *kind_obj, *width_obj;
    RunSet *S = PyMem_Calloc(1, sizeof(RunSet));
    if (S == NULL)
        return PyErr_NoMemory();
    Layout *L = &S->L;
    if (!PyArg_ParseTuple(args, "OOOOiiii", &runs_obj, &live_obj, &kind_obj, &width_obj, &L->key, &L->ts, &L->exp,
                          &L->nout))
        goto fail;
    if (PyObject_GetBuffer(kind_obj, &S->kind_buf, PyBUF_C_CONTIGUOUS) < 0 ||
        PyObject_GetBuffer(width_obj, &S->width_buf, PyBUF_C_CONTIGUOUS) < 0)
        goto fail;
    L->ncols = (int)(S->kind_buf.len / 4);
    L->kind = S->kind_buf.buf;
    L->width = S->width_buf.buf;
    L->text_key = L->ncols > L->key && L->key >= 0 && L->kind[L->key] == VARIABLE;
    if (L->ncols < 1 || L->ncols > MAX_COLUMNS || S->width_buf.len != S->kind_buf.len || L->nout < 1 ||
        L->nout > L->ncols || L->key < 0 || L->key >= L->nout || L->ts < 0 || L->ts >= L->nout || L->exp < 0 ||
        L->exp >= L->nout || (L->kind[L->key] != VARIABLE && (L->kind[L->key] != FIXED || L->width[L->key] != 8)) ||
        L->width[L->ts] != 8 || L->width[L->exp] != 8) {
        PyErr_SetString(PyExc_ValueError, "bad column layout");
        goto fail;
    }
    if ((S->handles = PySequence_Tuple(runs_obj)) == NULL)
        goto fail;
    PyObject *live = PySequence_Fast(live_obj, "live must be a sequence");
    if (live == NULL)
        goto fail;
    Py_ssize_t n = PyTuple_GET_SIZE(S->handles);
    if (PySequence_Fast_GET_SIZE(live) != n) {
        Py_DECREF(live);
        PyErr_SetString(PyExc_ValueError, "one (max_exp, first_live) a run");
        goto fail;
    }
    S->runs = PyMem_Calloc(n ? n : 1, sizeof(Run));
    if (S->runs == NULL) {
        Py_DECREF(live);
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const Run *h = PyCapsule_GetPointer(PyTuple_GET_ITEM(S->handles, i), RUN);
        long long max_exp, first_live;
        if (h == NULL || !PyArg_ParseTuple(PySequence_Fast_GET_ITEM(live, i), "LL", &max_exp, &first_live)) {
            Py_DECREF(live);
            goto fail;
        }
        if (h->text != L->text_key) {
            Py_DECREF(live);
            PyErr_SetString(PyExc_ValueError, "run arrays disagree");
            goto fail;
        }
        S->runs[i] = *h;
        S->runs[i].max_exp = max_exp;
        S->runs[i].first_live = first_live;
    }
    S->nruns = n;
    Py_DECREF(live);
    S->cold = 1;
    PyObject *capsule = PyCapsule_New(S, RUNSET, destroy_runset);
    if (capsule == NULL)
        goto fail;
    return capsule;
fail:
    free_runset(S);
    return NULL;
}

/* (batch, visited, address) of a finished probe (see ``probe``'s doc string), or NULL with an exception. */
static PyObject *result_of(const RunSet *S, Probe *P) {
    struct ArrowArray *out = P->nrows ? batch(&S->L, P->cand, P->rows, P->nrows) : NULL;
    if (out == NULL && P->nrows)
        return NULL;
    PyObject *visited = PyList_New(0);
    if (visited == NULL) {
        release_batch(out);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < S->nruns; i++) {
        if (!P->seen[i])
            continue;
        PyObject *v = Py_BuildValue("(nLL)", i, (long long)P->seen[i], (long long)P->bytes[i]);
        if (v == NULL || PyList_Append(visited, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(visited);
            if (out != NULL)
                release_batch(out);
            return NULL;
        }
        Py_DECREF(v);
    }
    if (out == NULL)  /* no rows: the caller has an empty table at hand */
        return Py_BuildValue("(ONi)", Py_None, visited, 0);
    PyObject *handed = batch_capsule(out);  /* owns the batch from here */
    if (handed == NULL) {
        Py_DECREF(visited);
        return NULL;
    }
    /* the struct's address too: importing it against a schema object the caller holds skips
     * exporting and parsing the schema on every probe (a third of the import's cost) */
    return Py_BuildValue("(NNN)", handed, visited, PyLong_FromVoidPtr(PyCapsule_GetPointer(handed, ARROW_ARRAY)));
}

static int start_probe(const RunSet *S, Probe *P) {
    Py_ssize_t n = S->nruns ? S->nruns : 1;
    P->seen = calloc(n, sizeof(int64_t));
    P->bytes = calloc(n, sizeof(int64_t));
    P->size = malloc(n * sizeof(int64_t));
    if (P->seen == NULL || P->bytes == NULL || P->size == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        P->size[i] = -1;
    open_pidfd();
    return 0;
}

static PyObject *probe(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *capsule, *key_obj, *result = NULL;
    long long as_of;
    if (!PyArg_ParseTuple(args, "OOL", &capsule, &key_obj, &as_of))
        return NULL;
    RunSet *S = PyCapsule_GetPointer(capsule, RUNSET);
    if (S == NULL)
        return NULL;
    const Layout *L = &S->L;
    Probe P = {0};
    Error err = {0};
    Key k = {0}, *key = &k;
    Py_ssize_t n = 0;
    if (L->text_key) {
        const char *str = PyUnicode_Check(key_obj) ? PyUnicode_AsUTF8AndSize(key_obj, &n) : NULL;
        if (str == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "the key must be a str");
            return NULL;
        }
        k.s = (const uint8_t *)str, k.n = (uint64_t)n;  /* the str's own UTF-8, kept while key_obj lives */
    } else {
        k.i = PyLong_AsLongLong(key_obj);
        if (k.i == -1 && PyErr_Occurred())
            return NULL;
    }
    if (start_probe(S, &P) == 0) {
        int ok;
        P.advise = S->cold;
        Py_BEGIN_ALLOW_THREADS  /* the caller's reference keeps the set, and so its maps, alive */
        int64_t t0 = now_ns();
        ok = plan(&P, S->runs, S->nruns, key, as_of, L->text_key, &err) == 0 && prepare(&P, S->runs, L, key, &err) == 0 &&
             search_blocks(&P, L, key, &err) == 0 && ahead_strings(&P, L, &err) == 0 && collect(&P, L, as_of, &err) == 0;
        if (now_ns() - t0 > COLD_PROBE_NS)
            S->cold = 1;
        else if (P.warm)
            S->cold = 0;
        Py_END_ALLOW_THREADS
        result = ok ? result_of(S, &P) : raise(&err);
    }
    free_probe(&P);
    return result;
}

static PyObject *probe_many(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *capsule, *keys_obj, *data_obj = Py_None, *result = NULL;
    long long as_of;
    if (!PyArg_ParseTuple(args, "OOL|O", &capsule, &keys_obj, &as_of, &data_obj))
        return NULL;
    RunSet *S = PyCapsule_GetPointer(capsule, RUNSET);
    if (S == NULL)
        return NULL;
    Py_buffer keys = {0}, data = {0};
    if (PyObject_GetBuffer(keys_obj, &keys, PyBUF_C_CONTIGUOUS) < 0 ||
        (data_obj != Py_None && PyObject_GetBuffer(data_obj, &data, PyBUF_C_CONTIGUOUS) < 0)) {
        if (keys.obj) PyBuffer_Release(&keys);
        return NULL;
    }
    Batch B = {0};
    Error err = {0};
    Keys K = {keys.len / 8, keys.buf, NULL, NULL};
    int text = S->L.text_key, bad = keys.len % 8 || text != (data_obj != Py_None);
    if (!bad && text) {  /* offsets: n + 1, ascending from 0 to the data's length */
        K = (Keys){keys.len / 8 - 1, NULL, keys.buf, data.buf};
        bad = K.n < 0 || ldi64(K.offsets) != 0 || ldi64(K.offsets + 8 * K.n) != data.len;
        for (Py_ssize_t k = 0; !bad && k < K.n; k++)
            bad = ldi64(K.offsets + 8 * k + 8) < ldi64(K.offsets + 8 * k);
    }
    if (bad) {
        PyErr_SetString(PyExc_ValueError, text ? "keys must be int64 offsets into data" : "keys must be int64");
    } else if ((B.slot = calloc(S->nruns ? S->nruns : 1, sizeof(Py_ssize_t *))) == NULL) {
        PyErr_NoMemory();
    } else if (start_probe(S, &B.P) == 0) {
        int ok;
        B.P.advise = 1;  /* a batch reads much of a block (B.advise) or pays little for the advice */
        Py_BEGIN_ALLOW_THREADS
        ok = batch_probe(&B, S->runs, S->nruns, &S->L, &K, as_of, &err) == 0;
        Py_END_ALLOW_THREADS
        result = ok ? result_of(S, &B.P) : raise(&err);
    }
    free_batch(&B, S->nruns);
    PyBuffer_Release(&keys);
    if (data.obj) PyBuffer_Release(&data);
    return result;
}

/* Each format fact this code is compiled with, under its disk_format.native_constants name. */
static const struct { const char *name; unsigned long long value; } FACTS[] = {
    {"entry_bytes", ENTRY_BYTES}, {"entry.offset", E_OFFSET}, {"entry.length", E_LENGTH}, {"entry.rows", E_ROWS},
    {"entry.min_exp", E_MIN_EXP}, {"entry.max_exp", E_MAX_EXP}, {"entry.max_ts", E_MAX_TS}, {"entry.slot", E_SLOT},
    {"entry.checksum", E_CHECKSUM}, {"page_bytes", PAGE}, {"page_sum_bytes", PAGE_SUM_BYTES},
    {"ipc_prefix_bytes", IPC_PREFIX}, {"ipc_continuation", IPC_CONTINUATION}, {"metadata_guess_bytes", METADATA_GUESS},
    {"filter_unit_bytes", FILTER_UNIT}, {"filter_sum_bytes", FILTER_SUM}, {"filter_probes", FILTER_PROBES}, {"filter_text_multiplier", FILTER_TEXT_MULTIPLIER},
};

static PyObject *check_format(PyObject *self, PyObject *facts) {
    (void)self;
    if (!PyDict_Check(facts)) {
        PyErr_SetString(PyExc_TypeError, "check_format takes a dict");
        return NULL;
    }
    PyObject *wrong = PyList_New(0);
    if (wrong == NULL)
        return NULL;
    for (size_t i = 0; i < sizeof FACTS / sizeof FACTS[0]; i++) {
        PyObject *v = PyDict_GetItemString(facts, FACTS[i].name);  /* borrowed */
        unsigned long long got = v != NULL && PyLong_Check(v) ? PyLong_AsUnsignedLongLong(v) : 0;
        if (PyErr_Occurred())
            PyErr_Clear();
        else if (v != NULL && PyLong_Check(v) && got == FACTS[i].value)
            continue;
        PyObject *line = v == NULL ? PyUnicode_FromFormat("%s: %llu here, absent in Python", FACTS[i].name, FACTS[i].value)
                                   : PyUnicode_FromFormat("%s: %llu here, %R in Python", FACTS[i].name, FACTS[i].value, v);
        if (line == NULL || PyList_Append(wrong, line) < 0) {
            Py_XDECREF(line);
            Py_DECREF(wrong);
            return NULL;
        }
        Py_DECREF(line);
    }
    return wrong;
}

/* -- mapping resident pages -------------------------------------------------------------------- */
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  /* Linux 5.14 */
#endif
#define RESIDENT_STEP_PAGES 512  /* pages looked at (and populated) a step: the map lock is held a step at a time */

/* Maps into the process the pages of ``map`` (a buffer) that are in the page cache, so that a
 * probe touching them later takes no page fault; pages not in memory are left alone (mincore
 * first), so this reads nothing from disk. Returns the pages mapped, or -1 if the kernel cannot
 * (no MADV_POPULATE_READ: before 5.14). The GIL is released throughout. */
static PyObject *map_resident(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    long long mapped = 0;
    uintptr_t base = (uintptr_t)view.buf, len = (uintptr_t)view.len, page = (uintptr_t)sysconf(_SC_PAGESIZE);
    if (page == 0 || base % page) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "map_resident takes a map that starts on a page");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    unsigned char vec[RESIDENT_STEP_PAGES];
    for (uintptr_t at = 0; at < len && mapped >= 0; at += RESIDENT_STEP_PAGES * page) {
        uintptr_t n = len - at < RESIDENT_STEP_PAGES * page ? len - at : RESIDENT_STEP_PAGES * page;
        uintptr_t pages = (n + page - 1) / page;
        if (mincore((void *)(base + at), n, vec) < 0)
            break;  /* the map is gone or was never one: nothing to do */
        for (uintptr_t i = 0; i < pages && mapped >= 0;) {
            if (!(vec[i] & 1)) {
                i++;
                continue;
            }
            uintptr_t j = i;
            while (j < pages && (vec[j] & 1))
                j++;
            uintptr_t from = at + i * page, to = at + j * page < len ? at + j * page : len;
            if (madvise((void *)(base + from), to - from, MADV_POPULATE_READ) < 0)
                mapped = errno == EINVAL ? -1 : mapped;  /* EINVAL: the kernel lacks it; else an evicted page: go on */
            else
                mapped += (long long)(j - i);
            i = j;
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(mapped);
}

static PyMethodDef methods[] = {
    {"check_lmdb_pages", check_lmdb_pages, METH_VARARGS,
     "check_lmdb_pages(file, txn_id[, size]) -> None or str\n\n"
     "page_walk.check's walk of version txn_id of an LMDB file (a buffer of the whole file): None if every\n"
     "page its trees reach is well-formed, else the first failure (lmdb_pages.c). file may also be a\n"
     "map_lmdb_file map, with the file's size as a third argument."},
    {"map_lmdb_file", map_lmdb_file, METH_VARARGS,
     "map_lmdb_file(fd, length) -> capsule\n\n"
     "A read-only shared map of length bytes of an LMDB file, longer than the file so that it serves\n"
     "check_lmdb_pages while the file grows; unmapped when the capsule is let go. OSError if it cannot be made."},
    {"newest_txnid", newest_txnid, METH_VARARGS,
     "newest_txnid(map, size) -> int or None\n\n"
     "The last committed transaction id of an LMDB file (its newer meta page's, as LMDB's env.info reports\n"
     "it), read from a map_lmdb_file map of a file of size bytes; None if its meta pages are not both valid."},
    {"map_resident", map_resident, METH_O,
     "map_resident(map) -> int\n\n"
     "Maps into the process the pages of a file map that are in the page cache (mincore, then\n"
     "MADV_POPULATE_READ), reading nothing from disk; the pages mapped, or -1 if the kernel cannot."},
    {"check_format", check_format, METH_O,
     "check_format(facts) -> list of str\n\n"
     "Each format fact this module was compiled with (disk_format.native_constants' names) that differs\n"
     "from, or is missing in, facts: empty if it reads the format Python writes."},
    {"block_arrays", block_arrays, METH_VARARGS,
     "block_arrays(blocks, filter_bits) -> (sections, page_start, filter_at)\n\n"
     "From a run's BLOCK entries (bytes-like), as bytes of int64: the first block of each section (a\n"
     "stretch of equal slot), then the number of blocks; each block's first page among the run's page\n"
     "sums, then the total; and each block's key filter's offset from the first one's, then where the\n"
     "last ends (key_filter.units with filter_bits a record; None if filter_bits is 0)."},
    {"block_extent", block_extent, METH_O,
     "block_extent(blocks) -> (end, pages)\n\n"
     "Of a run's BLOCK entries (bytes-like): the byte after its last block (offset + length; 0 for none)\n"
     "and the number of page sums its blocks have (disk_format.page_count of each length, summed)."},
    {"prepared_run", prepared_run, METH_VARARGS,
     "prepared_run(map, fd, first, last, blocks, sections, page_start, sums[, first_at, last_at, filter_at, filters])\n"
     "-> Run capsule\n\n"
     "One run's map (None for an empty file), its file descriptor and its arrays (point_probe.RunArrays),\n"
     "checked against each other and held for every run set that takes the run."},
    {"run_set", run_set, METH_VARARGS,
     "run_set(runs, live, kinds, widths, key_col, ts_col, exp_col, n_out) -> RunSet capsule\n\n"
     "The runs a probe searches (prepared_run capsules) with each one's (max_exp, first_live) in this version,\n"
     "and the stored schema's layout (int32 kind and width per column, where the key, ts and exp columns\n"
     "are, how many leading columns a probe returns), checked and held for the probes of one version."},
    {"probe", probe, METH_VARARGS,
     "probe(run_set, key, as_of) -> (batch, visited, address)\n\n"
     "The records with this key (an int64, or a str for a string key column) valid at as_of, ordered by (exp, ts), from the blocks of the\n"
     "set's runs that may hold it; every page used is checked first. batch: None if there are none,\n"
     "else a PyCapsule named \"arrow_array\" (the Arrow PyCapsule interface) holding the returned columns, for an object's\n"
     "__arrow_c_array__ to hand to pyarrow.record_batch; address: the ArrowArray struct the capsule owns (0 without a batch),\n"
     "for pyarrow.RecordBatch._import_from_c while the capsule lives. visited: (run index, blocks, bytes) of each run with blocks searched.\n"
     "BlockError((run index, block offset, message, errno)) if a block is damaged (errno 0) or its file\n"
     "cannot be read (the errno of the failed call)."},
    {"probe_many", probe_many, METH_VARARGS,
     "probe_many(run_set, keys, as_of[, data]) -> (batch, visited, address)\n\n"
     "probe for every key of keys (ascending: a buffer of int64, or for a string key column the int64\n"
     "offsets of each key in data, UTF-8) in one call, each block decoded and each\n"
     "page checked once for all its keys: the records ordered by (key, exp, ts); visited counts each\n"
     "block once. Errors as probe's."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_point_probe", NULL, -1, methods, NULL, NULL, NULL, NULL};

/* How many threads share a probe of many blocks: EBB_PROBE_THREADS if set (1: the caller's alone),
 * else the CPUs this process may run on, at most 4 (beyond that a probe's memory traffic, not its
 * hashing, bounds it). */
static int cpus_for_probes(void) {
    const char *env = getenv("EBB_PROBE_THREADS");
    long n = env != NULL ? strtol(env, NULL, 10) : -1;
    if (n < 1) {
#ifdef __linux__
        cpu_set_t cpus;
        n = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
#else
        n = sysconf(_SC_NPROCESSORS_ONLN);
#endif
        n = n > 4 ? 4 : n;
    }
    return n < 1 ? 1 : n > MAX_PROBE_THREADS ? MAX_PROBE_THREADS : (int)n;
}

PyMODINIT_FUNC PyInit__point_probe(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
#ifdef HAVE_PROCESS_MADVISE
    pthread_atfork(NULL, NULL, forked_child);
#endif
    pthread_atfork(NULL, NULL, spare_forked);
#ifdef PAGE_HASH_AVX2
    __builtin_cpu_init();
    cpu_avx2 = __builtin_cpu_supports("avx2") && getenv("EBB_NO_AVX2") == NULL;
#endif
    probe_threads = cpus_for_probes();
    BlockError = PyErr_NewException("_point_probe.BlockError", NULL, NULL);
    if (BlockError == NULL || PyModule_AddObject(m, "BlockError", BlockError) < 0) {
        Py_XDECREF(BlockError);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(BlockError);
    return m;
}
