#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): the bfloat16 ResNet-50 step's speed, memory and MFU at batch
# 256 and the largest batch that fits, the V100 float16 recipe, the demo and the input pipeline, in under
# 8 minutes on one H200. Results: $OUT/gpu_check.json (rewritten after every stage) and gpu_check.log.
#
# The GPU machine has no internet and no ml-collections. Once, on the development machine, in the repo:
#   python -m pip download --no-deps --only-binary=:all: -d .device_wheels ml-collections==1.1.0
# Then the device tool's call (.device_wheels/ is git-ignored, so it travels only when carried):
#   run(command="bash benchmarks/gpu_check.sh", carry=[".device_wheels"], timeout_s=540)
# Elsewhere: bash benchmarks/gpu_check.sh --out=/tmp/gpu_check ($OUT, when set, wins). Arguments go to
# gpu_check.py: --stages=environment,train_step_bf16 runs only those, --smoke runs a tiny model on a CPU.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
python="${PYTHON:-python3}"
wheels="${GPU_CHECK_WHEELS:-$repo/.device_wheels}"  # Pure-Python wheels the machine lacks.
site="${GPU_CHECK_SITE:-/tmp/gpu_check_site}"

shopt -s nullglob
wheel_files=("$wheels"/*.whl)
if ((${#wheel_files[@]})); then
  # No index (no internet there), no dependencies (the machine has absl-py and PyYAML).
  if PIP_ROOT_USER_ACTION=ignore "$python" -m pip install -q --no-index --no-deps --no-compile \
      --no-cache-dir --upgrade --target "$site" "${wheel_files[@]}"; then
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "gpu_check.sh: installing ${wheel_files[*]} failed; going on (the stages record what fails)" >&2
  fi
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec "$python" benchmarks/gpu_check.py "$@"
