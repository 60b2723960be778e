"""Process-level settings for the data path: memory reuse and the open-file limit.

A training batch holds ~10 MB of region features (32 images x 36 regions x 2048 float32). glibc's malloc serves
blocks that large with fresh `mmap`s, or grows and trims its heap around them, so each batch's tensors arrive in new
pages that the kernel must fault in and zero. Measured on the 2-core machine (by-id data path, 20k-image store):
11-16 ms of system time per batch of 32, about as much as the data work itself; with the thresholds below, 2-5 ms.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

try:
    import resource
except ImportError:  # Windows
    resource = None

__all__ = ["retain_freed_memory", "raise_open_file_limit", "open_file_limit"]

logger = logging.getLogger(__name__)

# mallopt(3) parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def retain_freed_memory(mmap_threshold_mb: int = 32, trim_threshold_mb: int = 64) -> bool:
    """Let glibc's malloc keep freed memory for reuse instead of returning it to the kernel after every batch.

    Blocks below `mmap_threshold_mb` come from the heap (not one `mmap` each), and up to `trim_threshold_mb` of free
    heap is kept rather than trimmed. The cost is at most that much memory held free per process, independent of the
    data's size. DataLoader workers forked afterwards inherit the setting. Training scripts (`pretrain.py`,
    `finetune.py`) call this once at start; a library user may call it too. Returns whether the setting took
    effect: False (and nothing changed) where the C library is not glibc (macOS, musl, Windows).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # glibc only: musl has mallopt as a stub that changes nothing
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    applied = bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold_mb << 20)) and bool(
        mallopt(_M_TRIM_THRESHOLD, trim_threshold_mb << 20)
    )
    if not applied:
        logger.warning("glibc refused the malloc thresholds; batches keep their page-fault cost")
    return applied


def open_file_limit() -> int | None:
    """This process's soft limit on open files (None where unknown or unlimited)."""
    if resource is None:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def raise_open_file_limit() -> int | None:
    """Raise this process's soft limit on open files to its hard limit, and return the new soft limit.

    A region store of millions of images has thousands of shards, and each memory-mapped shard holds a file
    descriptor while it is open; a soft limit of 1,024 (a common default) would force a store to close and reopen
    shards during random reads. Raising the soft limit up to the hard one needs no privilege. DataLoader workers
    inherit it. Training scripts call this once at start.
    """
    if resource is None:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as err:  # e.g. macOS refuses RLIM_INFINITY
            logger.debug(f"open-file limit left at {soft}: {err}")
    return open_file_limit()
