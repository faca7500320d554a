"""The benchmark scripts import each other by module name (they run as `python benchmarks/<name>.py`): put
their folder on the path for the tests of their logic."""

import sys
from pathlib import Path

BENCHMARKS = str(Path(__file__).parents[2] / "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)
