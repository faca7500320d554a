#!/usr/bin/env bash
# The GPU checks of the project in one call on a CUDA machine (the device tool's `run`), ~9 min on an H200:
# the benchmark (benchmarks/gpu.py, <= 290 s of measurement) and then the GPU tests (pytest -m gpu tests/gpu,
# <= 215 s). Prepare on this side first: `make install && bash ../shared/gpu/prepare.sh &&
# bash benchmarks/gpu_wheels.sh`, then run with carry [".gpu-wheels"]:
#     source .gpu-wheels/env.sh && bash benchmarks/gpu_check.sh
# Writes under $OUT (default /tmp/gpu-check): gpu/gpu.md, gpu/gpu_{model,kernels,profile}.csv, bench.log,
# pytest_gpu.log, machine.txt. Commit GPU results only from such a run (benchmarks/results/gpu.*).
set -uo pipefail
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT/gpu"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/machine.txt" 2>&1
timeout 330 python3 benchmarks/gpu.py --out "$OUT/gpu" --budget-s 290 > "$OUT/bench.log" 2>&1
echo "benchmark exit status $?" | tee -a "$OUT/bench.log"
timeout 215 python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider --durations=15 > "$OUT/pytest_gpu.log" 2>&1
echo "pytest exit status $?" | tee -a "$OUT/pytest_gpu.log"
tail -3 "$OUT/bench.log"
tail -15 "$OUT/pytest_gpu.log"
