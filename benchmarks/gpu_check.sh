#!/usr/bin/env bash
# The GPU checks of the project in one call on a CUDA machine (the device tool's `run`), <= 9.7 min on an H200:
# the benchmark (benchmarks/gpu.py, <= 260 s of measurement), the GPU tests (pytest -m gpu tests/gpu, <= 190 s)
# and, in processes of their own, the compiled generate test (run 1: a segmentation fault inside inductor's
# static CUDA launcher took the rest of pytest down): as is, and if that fails, again with Triton's own
# launcher (TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER=0), to tell the two apart. Prepare on this side first:
# `make install && bash ../shared/gpu/prepare.sh && bash benchmarks/gpu_wheels.sh`, then run with carry
# [".gpu-wheels"]:
#     source .gpu-wheels/env.sh && bash benchmarks/gpu_check.sh
# Writes under $OUT (default /tmp/gpu-check): gpu/gpu.md, gpu/gpu_{model,kernels,profile}.csv, bench.log,
# pytest_gpu.log, machine.txt. Commit GPU results only from such a run (benchmarks/results/gpu/).
set -uo pipefail
OUT=${OUT:-/tmp/gpu-check}
COMPILED=tests/gpu/test_cuda.py::test_compiled_reduce_overhead_generate_equals_eager
PYTEST=(python3 -m pytest -m gpu -q -p no:cacheprovider)
mkdir -p "$OUT/gpu"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/machine.txt" 2>&1
timeout 290 python3 benchmarks/gpu.py --out "$OUT/gpu" --budget-s 260 > "$OUT/bench.log" 2>&1
echo "benchmark exit status $?" | tee -a "$OUT/bench.log"
timeout 190 "${PYTEST[@]}" tests/gpu --deselect "$COMPILED" --durations=15 > "$OUT/pytest_gpu.log" 2>&1
echo "pytest exit status $?" | tee -a "$OUT/pytest_gpu.log"
echo "== $COMPILED" >> "$OUT/pytest_gpu.log"
timeout 50 "${PYTEST[@]}" "$COMPILED" >> "$OUT/pytest_gpu.log" 2>&1
status=$?
echo "compiled generate exit status $status" | tee -a "$OUT/pytest_gpu.log"
if [ "$status" -ne 0 ]; then
    echo "== $COMPILED with TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER=0" >> "$OUT/pytest_gpu.log"
    TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER=0 timeout 50 "${PYTEST[@]}" "$COMPILED" >> "$OUT/pytest_gpu.log" 2>&1
    echo "compiled generate, Triton's launcher: exit status $?" | tee -a "$OUT/pytest_gpu.log"
fi
tail -3 "$OUT/bench.log"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -8
