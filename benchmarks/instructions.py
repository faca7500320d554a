"""Instructions the CPU executes in a piece of code, counted by valgrind's callgrind.

A count, not a time: the same code gives the same count (within about 0.5 %, from the allocator and the
garbage collector) on an idle or a busy machine, so ratios of a few percent that the rounds of a wall clock
on a shared machine cannot resolve are resolved here. It weighs every instruction alike: the time a GEMV
waits for memory is not in it, and host code (Python, the dispatcher, small ops) runs fewer instructions per
cycle than a GEMV's vector loop, so a count ratio and a time ratio need not agree. Under callgrind the code
runs about 50 times slower, in one thread at a time.

A script calls `run_under_callgrind()` first: outside callgrind it runs the same command line again under
`valgrind --tool=callgrind` (collection off) and exits with its status; inside, it returns, and `count(run)`
turns collection on around `run()` and reads the dump.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

DUMP_ENV = "GATE_ATTENTION_CALLGRIND_OUT"  # callgrind's output file, set for the run under callgrind


def run_under_callgrind() -> None:
    """Outside callgrind: run this process's command line again under it and exit with its status. Inside
    (started so): return."""
    if os.environ.get(DUMP_ENV):
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("counting instructions needs valgrind on PATH (Debian/Ubuntu: apt install valgrind)")
    folder = tempfile.mkdtemp(prefix="callgrind-")
    dump = f"{folder}/callgrind.out"
    command = ["valgrind", "-q", "--tool=callgrind", "--collect-atstart=no", f"--callgrind-out-file={dump}"]
    try:
        environment = {**os.environ, DUMP_ENV: dump}
        status = subprocess.run([*command, sys.executable, *sys.argv], env=environment).returncode
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    raise SystemExit(status)


def count(run: Callable[[], object]) -> int:
    """Instructions executed while `run()` runs, in a process that `run_under_callgrind` started."""
    dump = Path(os.environ[DUMP_ENV])
    torch._C._valgrind_toggle_and_dump_stats()  # collection on; the dump holds nothing
    run()
    torch._C._valgrind_toggle_and_dump_stats()  # dumps what `run()` executed; collection off
    parts = sorted(dump.parent.glob(f"{dump.name}.*"), key=lambda path: int(path.suffix[1:]))
    summary = re.search(r"^summary: (\d+)$", parts[-1].read_text(), re.MULTILINE)
    for part in parts:
        part.unlink()
    return int(summary.group(1))
