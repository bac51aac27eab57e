#!/bin/sh
# tools/build_nccl.sh SRC OUT [JOBS]: a small NCCL (>= 2.30.3, the first to run several ranks on
# one GPU: NCCL_MULTI_RANK_GPU_ENABLE) from a checkout or archive of NVIDIA/nccl at SRC, installed
# in OUT (OUT/include, OUT/lib), for sm_90 and only the kernels pipeline_nccl.h launches: ncclSend/
# ncclRecv (SendRecv) and the sum all-reduce of f32 and f64, the only dtypes its all-reduce takes
# (f16/bf16 are refused before NCCL; NCCL's symmetric kernels are built whatever ONLY_FUNCS says).
# v2.30.7-1 on two cores: 12.5 minutes; the library stripped, the static archive (78 MB) dropped:
# 7.8 MB in all (NCCL's full library is 250 MB). Then
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
t0=$(date +%s)
grep -E 'NCCL_(MAJOR|MINOR|PATCH) ' "$src/makefiles/version.mk"
ver=$(awk '/^NCCL_(MAJOR|MINOR|PATCH) /{print $3}' "$src/makefiles/version.mk" | tr '\n' ' ')
set -- $ver
if [ $# -ne 3 ] || [ $(( $1 * 10000 + $2 * 100 + $3 )) -lt 23003 ]; then
    echo "build_nccl: $src is NCCL $(echo "${ver:-none}" | sed "s/ *$//; s/ /./g"); several ranks on one GPU need 2.30.3 or later (NCCL_MULTI_RANK_GPU_ENABLE)" >&2
    exit 1
fi
make -C "$src" -j"$jobs" src.build CUDA_HOME="$farm" BUILDDIR="$out" \
     ONLY_FUNCS="SendRecv|AllReduce Sum f32 * *|AllReduce Sum f64 * *" \
     NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90"
rm -rf "$farm" "$out/obj" "$out/lib/libnccl_static.a"
strip --strip-unneeded "$out"/lib/libnccl.so.2.*
ls -l "$out/lib"
du -sh "$out"
echo "build_nccl: $(( $(date +%s) - t0 )) s"
