#!/usr/bin/env bash
# The cupy package matching PYTHON's CUDA torch, for the fused kernels of a GPU server
# (paramserver/compute/fused.py): cupy-cuda12x for CUDA 12.*, cupy-cuda13x for 13.*; nothing for
# a CPU torch. scripts/setup.sh and bench/gpu_check.sh ask it.
#   scripts/cupy_package.sh PYTHON
set -euo pipefail
"${1:?usage: scripts/cupy_package.sh PYTHON}" -c '
import torch
cuda = torch.version.cuda
print("cupy-cuda%sx" % cuda.split(".")[0] if cuda else "")'
