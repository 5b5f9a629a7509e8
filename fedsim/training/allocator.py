"""The C allocator's settings in training processes (glibc's ``malloc`` on Linux).

torch's CPU tensors come from the C library's ``malloc``. glibc serves a block of 128 KiB or
more with a fresh ``mmap`` (a threshold it raises after such a block is freed, up to 32 MiB) and
returns free memory at the top of its heap to the system as soon as more than 128 KiB is free
there. A local SGD step allocates and frees the same few-megabyte tensors every step
(activations, gradients, oneDNN's LSTM workspaces), so under these defaults many of them are
new pages each step, which the kernel zero-fills on first touch. On the 2-core development CPU
one training step of LEAF's character LSTM (batch 8 × 80 characters) takes 44 ms in a fresh
process with the defaults and 36 ms with :func:`tune_allocator` (about 5,600 minor page faults
per step against under one; ``benchmarks/throughput.py`` measures whole rounds).

:func:`tune_allocator` sets glibc's ``M_MMAP_THRESHOLD`` to 32 MiB (its largest: smaller blocks
come from the heap), ``M_TRIM_THRESHOLD`` to 256 MiB (free heap memory up to that stays with
the process) and ``M_ARENA_MAX`` to 1 (every thread allocates from the main heap: the server's
aggregation runs in one of Flower's threads, whose own arena mapped fresh pages for each
16 MB temporary of the Stack Overflow LSTM, about 12 ms each), so those tensors reuse memory
the process already has. The cost: a process keeps up to ``TRIM_BYTES`` of freed memory
instead of returning it. Arithmetic is unchanged (torch aligns every CPU tensor to 64 bytes
either way; ``tests/test_allocator.py`` runs both ways). It applies to the calling process only; fedsim
calls it in every process that trains (the in-process engine's, each Ray worker's, each
SuperNode's ClientApp) and in the server process, unless ``sim.allocator = "system"``. Elsewhere
(macOS, musl) it does nothing and says so by returning False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform

#: ``mallopt`` parameter numbers (glibc's ``malloc.h``).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
#: blocks below this come from the heap (glibc refuses more than 32 MiB on 64-bit systems).
MMAP_BYTES = 32 << 20
#: free heap memory kept by the process before any is returned to the system.
TRIM_BYTES = 256 << 20


@functools.cache
def tune_allocator() -> bool:
    """Set this process's glibc ``malloc`` settings (see the module docstring); True when all
    three took effect, False where there is no glibc. Runs once per process."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        mallopt.restype = ctypes.c_int
    except (OSError, AttributeError):
        return False
    settings = ((M_MMAP_THRESHOLD, MMAP_BYTES), (M_TRIM_THRESHOLD, TRIM_BYTES), (M_ARENA_MAX, 1))
    return all(mallopt(param, value) == 1 for param, value in settings)
