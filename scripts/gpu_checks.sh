#!/usr/bin/env bash
# The GPU checks (issue 34) as one run on a lent CUDA machine, from the repository root:
# versions, the CUDA bench (bench/cuda_models.py), then the CUDA-marked tests. Each step has
# its own time limit so the run ends inside the device's budget; logs go to $OUT (or /tmp).
# Packages the machine lacks travel as wheels in .whl/ (see the device tool's README).
#   STEPS="bench tests"  which steps run, in that order (both by default); "copies" adds the
#                        copy rates alone with the upward copy step's parts (about 20 s)
#   BENCH_ARGS="..."     more arguments for bench/cuda_models.py (--profile 8)
#   ORT_GPU_SITE=DIR     a folder holding onnxruntime-gpu's package: the bench's peer imports it
#                        (the tests keep the machine's own ONNX Runtime as their oracle)
# onnxruntime-gpu is too big for one carry: scripts/onnxruntime_gpu_parts.sh packs it in two.
# A call carrying .ortA keeps that part in /tmp; a later call on the same (warm) machine
# carrying .ortB joins both and sets ORT_GPU_SITE. Two calls, in the device tool's words:
#   run "STEPS=tests bash scripts/gpu_checks.sh"  carry [".ortA", ".whl"]
#   run "STEPS=bench bash scripts/gpu_checks.sh"  carry [".ortB", ".whl"]  (within 30 s)
set -u
OUT=${OUT:-/tmp/gpu_checks}
STEPS=${STEPS:-bench tests}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ -f .ortA/ort.part.aa ]; then
    mkdir -p /tmp/ortpart && cp .ortA/ort.part.aa /tmp/ortpart/ \
        && echo "onnxruntime-gpu: part a kept"
fi
if [ -z "${ORT_GPU_SITE:-}" ] && [ -f /tmp/ortpart/ort.part.aa ] && [ -f .ortB/ort.part.ab ]; then
    mkdir -p /tmp/ortgpu && cat /tmp/ortpart/ort.part.aa .ortB/ort.part.ab | xz -d -T0 \
        | tar x -C /tmp/ortgpu && ORT_GPU_SITE=/tmp/ortgpu && echo "onnxruntime-gpu: unpacked"
fi
BENCH_PATH="${ORT_GPU_SITE:+$ORT_GPU_SITE:}$PYTHONPATH"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
PYTHONPATH=$BENCH_PATH python3 -c "import onnxruntime as o, cupy; print('ONNX Runtime',
o.__version__, o.get_available_providers(), '| CuPy', cupy.__version__)" | tee -a "$OUT/gpu.txt"
python3 -c "from graph_runtime.lib.kernels import cuda_cudnn as c; print('cuDNN', c.version(),
c.loaded_library('libcudnn.so'))" 2>&1 | tail -1 | tee -a "$OUT/gpu.txt"
if [[ " $STEPS " == *" copies "* ]]; then
    timeout "${COPIES_S:-90}" python3 bench/cuda_models.py --copies --rounds 3 2>&1 \
        | tee "$OUT/copies.log"
    echo "copies exit ${PIPESTATUS[0]}"
fi
if [[ " $STEPS " == *" bench "* ]]; then
    PYTHONPATH=$BENCH_PATH timeout "${BENCH_S:-240}" python3 bench/cuda_models.py --rounds 5 \
        ${BENCH_ARGS:-} --json "$OUT/cuda.json" 2>&1 | tee "$OUT/bench.log"
    echo "bench exit ${PIPESTATUS[0]}"
fi
if [[ " $STEPS " == *" tests "* ]]; then
    timeout "${TESTS_S:-270}" python3 -m pytest -m cuda -q -p no:cacheprovider -o addopts="" \
        tests > "$OUT/tests.log" 2>&1
    echo "tests exit $?"
    grep -E "passed|failed|error" "$OUT/tests.log" | tail -5
    grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -30
fi
