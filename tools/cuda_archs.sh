#!/bin/sh
# The CUDA architectures to build for (compute capabilities without the dot, ascending), for the
# Makefile's CUDA_ARCHS: those of the GPUs nvidia-smi finds here, where nvcc supports them; else
# (no GPU, or one nvcc cannot target) the default list, 80 and 90 (A100; H100 and H200), as far
# as nvcc supports them; without nvcc, the default list as it is.
# usage: sh tools/cuda_archs.sh [NVCC]          prints e.g. "80 90"
nvcc=${1:-nvcc}
default="80 90"
supported=$("$nvcc" --list-gpu-arch 2>/dev/null | sed -n 's/^compute_\([0-9][0-9]*\)$/\1/p')
if [ -z "$supported" ]; then echo "$default"; exit 0; fi
has() { printf '%s\n' "$supported" | grep -qx "$1"; }
pick=""
for a in $(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d '. ' | sort -un); do
  has "$a" && pick="$pick $a"
done
if [ -z "$pick" ]; then
  for a in $default; do has "$a" && pick="$pick $a"; done
fi
# nvcc supports none of the defaults (a far newer or older toolkit): its newest architecture
[ -n "$pick" ] || pick=$(printf '%s\n' "$supported" | sort -n | tail -1)
echo $pick
