/* The page check of an LMDB file (lmdb_pages.c), in ebb's native module (point_probe.c's table). */
#ifndef EBB_LMDB_PAGES_H
#define EBB_LMDB_PAGES_H
#include <Python.h>

/* check_lmdb_pages(file, txn_id[, size]) -> None, or the first failure (str): page_walk.check's
 * walk of the version ``txn_id`` of an LMDB file (a buffer of the whole file, or a map_lmdb_file
 * map with the file's ``size``), its checks and messages. */
PyObject *check_lmdb_pages(PyObject *self, PyObject *args);

/* map_lmdb_file(fd, length) -> a capsule holding a read-only shared map of ``length`` bytes of
 * the file (more than it holds: room for it to grow), unmapped when the capsule goes. */
PyObject *map_lmdb_file(PyObject *self, PyObject *args);

/* newest_txnid(map, size) -> int or None: the id of the last committed transaction of an LMDB file,
 * from its two meta pages in a map_lmdb_file map of a file of ``size`` bytes (as mdb_env_info
 * reports it); None if they are not both meta pages. */
PyObject *newest_txnid(PyObject *self, PyObject *args);

#endif
