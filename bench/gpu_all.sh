#!/usr/bin/env bash
# Every GPU check and benchmark in one go, for a machine with a GPU (a lent one runs it in one call):
#   bash bench/gpu_all.sh OUT_DIR [TOKENS_IN_MEMORY] [TOKENS_END_TO_END]
# Logs land in OUT_DIR: CUDA parity (verl, older families, every replayed trainer's upstream cases),
# in-memory engine throughput, a torch-profiler breakdown per chunk, and end to end against pyarrow's read.
set -u -o pipefail
out=${1:?OUT_DIR}; mem=${2:-40000000}; e2e=${3:-50000000}
here=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$here:$here/bench:$here/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$here"
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" | tee "$out/device.log"
timeout 100 python3 -m pytest -q --tb=line -p cuda_parity -p no:cacheprovider tests/engine/test_*_parity.py \
  > "$out/parity_families.log" 2>&1; tail -15 "$out/parity_families.log"
timeout 80 python3 bench/bench_engine.py --device cuda --tokens "$mem" --turns 1 4 --repeats 2 \
  2>&1 | tee "$out/engine.log"
timeout 40 python3 bench/bench_engine.py --device cuda --tokens "$mem" --turns 4 --profile \
  > "$out/profile.log" 2>&1; head -3 "$out/profile.log"
timeout 90 python3 bench/gpu_check.py --tokens "${GPU_CHECK_TOKENS:-10000000}" 2>&1 | tee "$out/gpu_check.log"
timeout 100 python3 bench/bench_scale.py --tokens "$e2e" --repeats 1 --padded-limit 0 --device cuda \
  2>&1 | tee "$out/scale.log"
