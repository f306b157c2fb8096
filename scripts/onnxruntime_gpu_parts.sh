#!/usr/bin/env bash
# onnxruntime-gpu for a lent GPU machine (issue 34's peer), in two parts that fit two carries:
# the wheel's CUDA provider kept to one architecture (scripts/strip_fatbin.py), the TensorRT
# provider, the C library and the Python tools dropped, packed with xz and split into .ortA/
# (44 MiB) and .ortB/ (the rest), both ignored by git. Run here, from the repository root:
#   bash scripts/onnxruntime_gpu_parts.sh [VERSION] [SM]    (defaults 1.31.1 and 90: an H200)
# then on the device: call 1 carries .ortA (scripts/gpu_checks.sh keeps it in /tmp), call 2,
# on the still-warm machine, carries .ortB; gpu_checks.sh joins them and the bench uses them.
set -euo pipefail
VERSION=${1:-1.31.1}
SM=${2:-90}
WORK=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$WORK" "onnxruntime-gpu==$VERSION"
(cd "$WORK" && unzip -q ./*.whl && rm ./*.whl)
CAPI="$WORK/onnxruntime/capi"
rm -f "$CAPI"/libonnxruntime_providers_tensorrt.so "$CAPI"/libonnxruntime.so.*
rm -rf "$WORK"/onnxruntime/{transformers,tools,quantization,datasets}
python3 scripts/strip_fatbin.py "$CAPI/libonnxruntime_providers_cuda.so" "$SM"
rm -rf .ortA .ortB && mkdir -p .ortA .ortB
(cd "$WORK" && tar cf - onnxruntime onnxruntime_gpu-*.dist-info) | xz -9e -T0 \
    | split -b 44M - "$WORK/ort.part."
if [ -e "$WORK/ort.part.ac" ]; then
    echo "packed, it is over 88 MiB: more than two carries" >&2
    exit 1
fi
mv "$WORK/ort.part.aa" .ortA/ && mv "$WORK/ort.part.ab" .ortB/
for d in /.ortA/ /.ortB/; do grep -qx "$d" .git/info/exclude || echo "$d" >> .git/info/exclude; done
rm -rf "$WORK"
du -sh .ortA .ortB
