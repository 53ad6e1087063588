"""LMDB 0.9's on-disk layout (lmdb.h, mdb.c; data format version 1), as the readers of a
chunk's pages without LMDB use it: read-ahead (cache/pages.py), gathered rows
(cache/pagemap.py) and token columns (cache/tokencolumns.py, ``overflow_page``). Each treats
anything else as a file it does not read (UnexpectedLayout)."""

from __future__ import annotations

import ctypes
import struct

__all__ = [
    "DATA_VERSION",
    "DB",
    "BRANCH_FIRST_NODE",
    "DB_OFFSET",
    "LAST_PAGE_OFFSET",
    "MAPSIZE_OFFSET",
    "META_PAGES",
    "MIN_KEYS",
    "F_BIGDATA",
    "INVALID_PAGE",
    "MAGIC",
    "META",
    "NODE",
    "PAGE_HEADER",
    "P_BRANCH",
    "P_LEAF",
    "P_LEAF2",
    "P_META",
    "P_OVERFLOW",
    "P_SUBPAGE",
    "TXNID_OFFSET",
    "node_max",
    "overflow_page",
]

PAGE_HEADER = 16  # PAGEHDRSZ: pgno (8), pad (2), flags (2), lower (2), upper (2)
P_BRANCH, P_LEAF, P_OVERFLOW, P_META, P_LEAF2, P_SUBPAGE = 0x01, 0x02, 0x04, 0x08, 0x20, 0x40
F_BIGDATA = 0x01  # a leaf node whose value lives on overflow pages (the node holds its pgno)
MAGIC = 0xBEEFC0DE
DATA_VERSION = 1  # MDB_DATA_VERSION of LMDB 0.9 (LMDB 1.0's pages have another header)
INVALID_PAGE = 2**64 - 1
META = struct.Struct("<IIQQ")  # after the page header of pages 0 and 1: magic, version, fixed
# address, map size; then the free DB's and the main DB's DB, then the last page and the txnid
DB = struct.Struct("<IHHQQQQQ")  # pad (page size, in the free DB's), flags, depth, branch,
# leaf, overflow pages, entries, root
NODE = struct.Struct("<HHHH")  # lo, hi (a leaf's value size; a branch's child pgno with flags),
# flags, key size; then the key, then the value
DB_OFFSET = PAGE_HEADER + META.size  # the free DB's; the main DB's follows it
TXNID_OFFSET = PAGE_HEADER + META.size + 2 * DB.size + 8
LAST_PAGE_OFFSET = TXNID_OFFSET - 8  # mm_last_pg: the last page the tree uses
MAPSIZE_OFFSET = PAGE_HEADER + 16  # mm_mapsize, in META
META_PAGES = 2  # NUM_METAS: pages 0 and 1; the tree's pages follow
MIN_KEYS = 2  # MDB_MINKEYS: a page holds at least two nodes, so a node is at most half a page
# A branch page's first node has no key (its child holds everything before the second's).
BRANCH_FIRST_NODE = NODE.size


def node_max(psize: int) -> int:
    """me_nodemax: the largest node, its slot in the page's index left out. A leaf node whose
    key and value come to more keeps its value on overflow pages of its own."""
    return (((psize - PAGE_HEADER) // MIN_KEYS) & -2) - 2


def overflow_page(address: int) -> int | None:
    """The number of the page that holds, on pages of its own, the large value whose bytes
    start at ``address`` in an environment's map (a value LMDB handed out): its page header
    lies just before them. None where that header is not an overflow page's."""
    pgno = ctypes.c_uint64.from_address(address - PAGE_HEADER).value
    flags = ctypes.c_uint16.from_address(address - PAGE_HEADER + 10).value
    return pgno if flags == P_OVERFLOW else None
