#!/usr/bin/env bash
# Every GPU check and benchmark in one go, for a machine with a GPU (a lent one runs it in one call):
#   bash bench/gpu_all.sh OUT_DIR [TOKENS_IN_MEMORY] [TOKENS_END_TO_END]
# STAGES (default: all of "check parity engine chunks profile syncs scale machine") picks some. Logs land in OUT_DIR:
# the fused GPU sweep against torch's passes (check), CUDA parity of every trainer's upstream cases (parity),
# in-memory engine throughput with the sweep on and off (engine; chunks: 2^23-2^25-position chunks), a
# torch-profiler breakdown per accumulator and per chunk (profile; CHUNK=N positions), every call that waits
# for the GPU, by line (syncs), end to end against pyarrow's read (scale), and this machine's table of one process,
# every core and the GPU at 50M, 200M and 1B tokens in 8 files (machine; bench_machine.py).
# A lent machine's image may hold an older typer than the CLI needs (0.27 on the H200 image, where typer 0.29 also
# needs pydantic): bring the wheels (typer, click, pydantic, pydantic-core, annotated-types, typing-inspection,
# typing-extensions; `pip download --no-deps --only-binary=:all: --python-version 3.12 --platform
# manylinux2014_x86_64 -d .whl NAME==VERSION`) and install them first: `pip install --no-index --no-deps --target
# /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site`. The CLI says which requirement is missing otherwise.
set -u -o pipefail
out=${1:?OUT_DIR}; mem=${2:-40000000}; e2e=${3:-50000000}
stages=${STAGES:-check parity engine chunks profile syncs scale machine}
here=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$here:$here/bench:$here/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$here"
python3 -c "import torch, triton; print(torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" \
  | tee "$out/device.log"
for stage in $stages; do
  echo "== $stage $(date +%T)"
  case $stage in
    check) timeout 150 python3 bench/gpu_sweep_check.py > "$out/check.log" 2>&1; tail -4 "$out/check.log" ;;
    parity) timeout 150 python3 -m pytest -q --tb=line -p cuda_parity -p no:cacheprovider \
              tests/engine/test_*_parity.py > "$out/parity_families.log" 2>&1; tail -8 "$out/parity_families.log" ;;
    engine) timeout 150 python3 bench/bench_engine.py --device cuda --tokens "$mem" --turns 4 --repeats 2 \
              --gpu-sweep both 2>&1 | tee "$out/engine.log" ;;
    chunks) for size in 8388608 16777216 33554432; do
              timeout 60 python3 bench/bench_engine.py --device cuda --tokens "$mem" --turns 4 --repeats 2 \
                --gpu-sweep on --chunk-positions $size 2>&1 | sed "s/^/$size /"
            done | tee "$out/chunks.log" ;;
    profile) timeout 60 python3 bench/bench_engine.py --device cuda --tokens "$mem" --turns 4 --profile \
               ${CHUNK:+--chunk-positions $CHUNK} > "$out/profile.log" 2>&1; head -14 "$out/profile.log" ;;
    syncs) timeout 60 python3 bench/gpu_syncs.py --tokens 8000000 > "$out/syncs.log" 2>&1; head -30 "$out/syncs.log" ;;
    scale) timeout 150 python3 bench/bench_scale.py --tokens "$e2e" --turns 4 --repeats 1 --padded-limit 0 --device cuda \
             2>&1 | tee "$out/scale.log" ;;
    machine) timeout 420 python3 bench/bench_machine.py --tokens 50000000 200000000 1000000000 --workdir /tmp/mm \
               --skip-at "1000000000:jobs 1,1000000000:cuda 2 threads" --cuda-read-threads 2 2>&1 \
               | tee "$out/machine.log" ;;
  esac
done
