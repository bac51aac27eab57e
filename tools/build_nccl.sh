#!/bin/sh
# tools/build_nccl.sh SRC OUT [JOBS]: a small NCCL (>= 2.30, the first to run several ranks on one
# GPU) from a checkout of NVIDIA/nccl at SRC, installed in OUT (OUT/include, OUT/lib), for sm_90
# and only the kernels pipeline_nccl.h launches (send/receive, f32/f64 sum all-reduce): about
# 10 minutes on two cores, 31 MB (6 MB stripped; NCCL's full library is 250 MB). Then
#   make gpu-nccl NCCL_HOME=OUT B=gpubuild     (what tools/gpu_nccl.sh runs on the GPU machine)
# The toolkit's own nccl*.h would shadow the new headers (NCCL_GIN_MAX_CONNECTIONS undeclared):
# NCCL is built against a copy of CUDA_HOME made of links, without them.
set -eu
src=${1:?usage: tools/build_nccl.sh NCCL_SRC OUT [JOBS]}
out=${2:?usage: tools/build_nccl.sh NCCL_SRC OUT [JOBS]}
jobs=${3:-$(nproc)}
cuda=${CUDA_HOME:-/usr/local/cuda}
mkdir -p "$out"
out=$(cd "$out" && pwd)
farm="$out/cuda-without-nccl"
rm -rf "$farm"
mkdir -p "$farm/include"
for f in "$cuda"/*; do [ "$(basename "$f")" = include ] || ln -s "$(readlink -f "$f")" "$farm/$(basename "$f")"; done
for f in "$cuda"/include/*; do case $(basename "$f") in nccl*) ;; *) ln -s "$(readlink -f "$f")" "$farm/include/$(basename "$f")" ;; esac; done
grep -E 'NCCL_(MAJOR|MINOR|PATCH) ' "$src/makefiles/version.mk"
make -C "$src" -j"$jobs" src.build CUDA_HOME="$farm" BUILDDIR="$out" \
     ONLY_FUNCS="SendRecv|AllReduce Sum f32 * *|AllReduce Sum f64 * *" \
     NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90"
rm -rf "$farm" "$out/obj"
ls -l "$out/lib"
