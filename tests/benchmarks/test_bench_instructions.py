"""benchmarks/instructions.py: a script that calls `run_under_callgrind()` runs again under callgrind, and
`count` gives each piece of code its own count, in proportion to the work."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import BENCHMARKS

SCRIPT = f"""
import sys
sys.path.insert(0, {BENCHMARKS!r})
import instructions
import torch

instructions.run_under_callgrind()
x = torch.ones(8)
print(*[instructions.count(lambda: [x.add(1) for _ in range(adds)]) for adds in (50, 100, 50)])
"""


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind")
def test_counts_are_per_call_and_in_proportion_to_the_work(tmp_path):
    script = tmp_path / "count.py"
    script.write_text(textwrap.dedent(SCRIPT))
    environment = {**os.environ, "TMPDIR": str(tmp_path)}  # where callgrind's dumps go
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=environment
    )
    assert result.returncode == 0, result.stderr
    fifty, hundred, fifty_again = map(int, result.stdout.split())
    assert fifty > 50 * 1000  # a torch op is thousands of instructions
    assert 1.8 < hundred / fifty < 2.2
    assert abs(fifty_again / fifty - 1) < 0.05  # the same work, the same count
    assert sorted(path.name for path in tmp_path.iterdir()) == ["count.py"]  # the dumps are removed
