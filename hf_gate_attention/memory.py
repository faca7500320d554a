"""The one peak-memory measurement of the project: how much memory one call adds at its peak, in MiB.

CUDA: the caching allocator's peak above what was allocated before the call. CPU (Linux): the resident set
size's high-water mark, reset through `/proc/self/clear_refs` just before the call (`VmHWM`), above the
resident size before it (`VmRSS`); the kernel raises the mark before it releases any page, so no peak is
missed. Freed memory that glibc still holds in its heap would be reused without raising the RSS, so it is
handed back first (`gc.collect`, `malloc_trim(0)`); for the tightest numbers also start the process with
`MALLOC_MMAP_THRESHOLD_=65536`, so that tensors are mmapped and returned when freed (`benchmarks/overhead.py`
does).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import re
from collections.abc import Callable
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")


def _status_mib(field: str) -> float:
    return int(re.search(rf"{field}:\s+(\d+) kB", _STATUS.read_text()).group(1)) / 1024


def peak_growth_mib(run: Callable[[], object], device: torch.device | str = "cpu") -> float:
    """Run `run()` once and return its peak memory growth in MiB on `device` (see the module docstring).

    Raises `RuntimeError` on a CPU whose kernel has no `/proc/self/status` (not Linux): no estimate is given
    rather than a wrong one.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        run()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    if not _STATUS.is_file():
        raise RuntimeError("peak CPU memory is measured through /proc/self (Linux only); not available here")
    _release_free_memory()
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark VmHWM to the current RSS
    before = _status_mib("VmRSS")
    run()
    return _status_mib("VmHWM") - before


def _release_free_memory() -> None:
    """Give freed heap memory back to the OS, so that the RSS rises with every new allocation of the call."""
    gc.collect()
    libc_name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(libc_name) if libc_name else None
    if hasattr(libc, "malloc_trim"):  # glibc
        libc.malloc_trim(0)
