#!/usr/bin/env bash
# Every GPU path of gpu-asgd on one CUDA machine, each number printed. Sized for one H200
# with 16 cores: about 3 minutes; every stage has a time limit, and the limits add up to
# 7.7 minutes, so the whole check fits one 8-minute device command even when stages hang,
# and its log is written as it goes (whatever ran comes back).
#
#   bench/gpu_check.sh prepare   # where pip reaches PyPI: puts the mpich and
#                                            # mpi4py wheels and Fashion-MNIST in .gpucheck/
#                                            # (within the device tool's 64 MiB carry: its
#                                            # image has CUDA torch and cupy-cuda13x; for a
#                                            # machine without cupy, CUPY_PACKAGES=
#                                            # "cupy-cuda13x==14.2.0", about 100 MB more)
#   bench/gpu_check.sh           # on the GPU machine, with .gpucheck/ brought along
#
# Python: .venv's when its torch sees CUDA (`make setup` on a GPU machine), else python3
# (a machine image with CUDA torch), into whose environment the wheels in .gpucheck/
# are installed (MPICH, as on the CPU reference machine; the cupy wheel that matches that
# torch's CUDA, scripts/cupy_package.sh). Without .gpucheck/fashion-mnist
# the training runs use a generated dataset. Stages:
#   1. versions, GPU, cupy, MPI library and whether it is CUDA-aware (paramserver/compute/gpu.py);
#   2. pytest tests/sim/test_gpu.py (cuda Store == numpy Store, cuda client run == cpu run,
#      each rule's fused cupy kernel == its torch update, NaN/Inf rejected by the kernel);
#   3. bench/studies/gpu_paths.py: pinned against pageable staging, the server's
#      push + pull on the GPU against numpy, and each rule's fused kernel against its
#      torch update and a device memcpy of the same bytes (target: within 1.5x of the
#      memcpy), at 1e6, 1.6e7 and 6e7 floats;
#   4. bench/wire.py wire and load: the MPI wire and the server loop on this
#      machine (host vectors: what the staging above adds to);
#   5. asgd train, 1 server + 4 clients on Fashion-MNIST, clients on cuda, with the server on
#      cuda and then on cpu: time, throughput, server busy, test error.
# Logs and JSON go to $OUT when it is set (the device tool's), else /tmp/gpucheck.
set -uo pipefail
cd "$(dirname "$0")/../.."
CHECK=.gpucheck

prepare() {
    local python=python3
    [ -x .venv/bin/python ] && python=.venv/bin/python
    mkdir -p "$CHECK/wheels"
    "$python" -m pip download -q --no-deps --only-binary=:all: --python-version "${PYVER:-3.12}" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
        -d "$CHECK/wheels" "mpich==${MPICH_VERSION:-5.0.2}" "mpi4py==${MPI4PY_VERSION:-4.1.2}" \
        ${CUPY_PACKAGES:+"cuda-pathfinder>=1.3.4,<2"} ${CUPY_PACKAGES-} || exit 1
    if [ -d /usr/share/datasets/fashion-mnist ]; then
        mkdir -p "$CHECK/fashion-mnist"
        cp /usr/share/datasets/fashion-mnist/*-ubyte.gz "$CHECK/fashion-mnist/"
    fi
    local exclude
    exclude=$(git rev-parse --git-path info/exclude)
    grep -qx "/$CHECK/" "$exclude" 2>/dev/null || echo "/$CHECK/" >>"$exclude"
    du -sh "$CHECK"
}

if [ "${1:-}" = prepare ]; then
    prepare
    exit 0
fi

WORK=/tmp/gpucheck
SAVE=${OUT:-$WORK}
rm -rf "$WORK" && mkdir -p "$WORK" "$SAVE"
exec > >(tee "$SAVE/gpu_check.log") 2>&1
FAILED=()

stage() {  # stage LIMIT_S NAME COMMAND...: run it, time it, note a failure and go on
    local limit=$1 name=$2 start=$SECONDS
    shift 2
    echo
    echo "== $name (limit ${limit} s)"
    timeout "$limit" "$@" || FAILED+=("$name")
    echo "-- $name: $((SECONDS - start)) s"
}

cuda_torch() { "$1" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; }
if [ -x .venv/bin/python ] && cuda_torch .venv/bin/python; then PY=.venv/bin/python; else PY=$(command -v python3); fi
cuda_torch "$PY" || { echo "gpu_check: $PY has no torch that sees a CUDA device"; exit 1; }
if compgen -G "$CHECK/wheels/*.whl" >/dev/null; then
    CUPY_WHEEL=$(scripts/cupy_package.sh "$PY" | tr - _)  # cupy_cuda12x: as wheel files spell it
    WHEELS=()
    for wheel in "$CHECK"/wheels/*.whl; do
        case ${wheel##*/} in cupy_cuda*) [[ ${wheel##*/} == "$CUPY_WHEEL"-* ]] || continue ;; esac
        WHEELS+=("$wheel")
    done
    stage 60 "install the wheels into $PY's environment" \
        "$PY" -m pip install -q --no-index --no-deps --no-cache-dir --force-reinstall "${WHEELS[@]}"
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # ignored by MPICH
MPIEXEC=$(dirname "$PY")/mpiexec
[ -x "$MPIEXEC" ] || MPIEXEC=$(command -v mpiexec)

if [ -f "$CHECK/fashion-mnist/train-images-idx3-ubyte.gz" ]; then
    DATA=(--data-dir "$CHECK/fashion-mnist")
else
    "$PY" -c "import sys, pathlib; from tests.conftest import make_tiny_npz
make_tiny_npz(pathlib.Path(sys.argv[1]), n=16384)" "$WORK/data.npz"
    DATA=(--data "$WORK/data.npz")
fi

stage 30 "versions" "$PY" -c '
import mpi4py, torch
from mpi4py import MPI
from paramserver.compute.gpu import cuda_aware_mpi
print("torch", torch.__version__, "| CUDA", torch.version.cuda, "|", torch.cuda.get_device_name(0))
print("MPI:", MPI.Get_library_version().splitlines()[0].strip(), "| mpi4py", mpi4py.__version__)
print("cuda_aware_mpi:", cuda_aware_mpi())
try:
    import cupy
    print("cupy", cupy.__version__, "| CUDA runtime", cupy.cuda.runtime.runtimeGetVersion())
except ImportError as error:
    print("cupy: not importable, so the server runs the torch rules:", error)'
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true

stage 100 "pytest tests/sim/test_gpu.py" "$PY" -m pytest -q -p no:cacheprovider -rs tests/sim/test_gpu.py

stage 70 "gpu_paths (staging, the server on the GPU, the fused kernels)" \
    "$PY" -m bench.studies.gpu_paths --json "$SAVE/gpu_paths.json"

stage 40 "wire (MPI wire, 2 ranks)" env OMP_NUM_THREADS=1 "$MPIEXEC" -n 2 "$PY" -m bench.wire wire \
    --sizes 1e6,1.6e7 --repeats 20 --json "$SAVE/wire.json"
stage 40 "load (4 clients, 1e6 floats)" env OMP_NUM_THREADS=1 "$MPIEXEC" -n 5 "$PY" -m bench.wire load \
    --size 1e6 --seconds 3 --json "$SAVE/load.json"
cat "$SAVE/wire.json" "$SAVE/load.json" 2>/dev/null

for server in cuda cpu; do
    stage 60 "asgd train: 4 clients on cuda, server on $server" "$PY" -m experiments.cli train --clients 4 \
        --steps 400 --eval-samples 2000 --quiet --device cuda --server-device "$server" "${DATA[@]}" \
        --out "$WORK/train-server-$server"
done
"$PY" - "$WORK" "$SAVE/train.json" <<'EOF'
import json, sys
from pathlib import Path

work, save = Path(sys.argv[1]), sys.argv[2]
runs = {}
for server in ("cuda", "cpu"):
    run = work / f"train-server-{server}"
    if (run / "summary.json").exists():
        summary = json.loads((run / "summary.json").read_text())
        provenance = json.loads((run / "config.json").read_text())["provenance"]
        summary["server_busy_fraction"] = summary["server_busy_s"] / summary["train_wall_s"]
        summary["cuda_aware_mpi"] = provenance.get("cuda_aware_mpi")
        summary["devices"] = [r["device"] for r in provenance["ranks"]]
        runs[f"server on {server}"] = summary
print(json.dumps(runs, indent=1))
Path(save).write_text(json.dumps(runs, indent=1))
EOF

echo
if [ ${#FAILED[@]} -eq 0 ]; then
    echo "gpu_check: every stage passed ($SECONDS s)"
else
    echo "gpu_check: FAILED: ${FAILED[*]} ($SECONDS s)"
    exit 1
fi
