#!/bin/sh
# The companion headers against a pipeline.h of another release must not compile, and the
# compiler's output must name both versions; against their own pipeline.h they compile (the
# control). Each header under gcc, clang and g++ (and nvcc for pipeline_cuda.h where it is
# installed), over the imitation CUDA and NCCL headers of tests/ and a stand-in <mpi.h>.
# usage: sh tests/version_skew.sh [BUILD_DIR]; ends "N passed, N failed", exit 1 on a failure.
B=${1:-build}
dir=$B/version-skew.d
rm -rf "$dir" && mkdir -p "$dir/same" "$dir/mpi" || exit 1
ver() { sed -n "s/^#define PP_VERSION_$1 \([0-9]*\)$/\1/p" pipeline.h; }
maj=$(ver MAJOR); min=$(ver MINOR); pat=$(ver PATCH)
[ -n "$maj" ] && [ -n "$min" ] && [ -n "$pat" ] || { echo "version_skew: no PP_VERSION_MAJOR/MINOR/PATCH in pipeline.h"; exit 1; }
ours="$maj.$min.$pat"
other="$maj.$((min + 1)).$pat"
num=$((maj * 10000 + min * 100 + pat)); othernum=$((maj * 10000 + (min + 1) * 100 + pat))
cp pipeline.h pipeline_cuda.h pipeline_nccl.h pipeline_mpi.h "$dir/same/" || exit 1
# skew-H: header H as it is, every other header of the next minor release (their versions
# changed), so that H's own check is the one that fires
for h in pipeline_cuda.h pipeline_nccl.h pipeline_mpi.h; do
  mkdir -p "$dir/skew-$h" && cp "$h" "$dir/skew-$h/" || exit 1
  for o in pipeline.h pipeline_cuda.h pipeline_nccl.h pipeline_mpi.h; do
    [ "$o" = "$h" ] && continue
    sed -e "s/^#define PP_VERSION_MINOR $min$/#define PP_VERSION_MINOR $((min + 1))/" \
        -e "s/^#define \(PP_[A-Z]*_VERSION\) $num /#define \1 $othernum /" \
        -e "s/PP_VERSION $num)/PP_VERSION $othernum)/" -e "s/$ours/$other/g" "$o" > "$dir/skew-$h/$o" || exit 1
  done
  grep -q "^#define PP_VERSION_MINOR $((min + 1))$" "$dir/skew-$h/pipeline.h" || { echo "version_skew: could not change the version"; exit 1; }
done
# <mpi.h>: the installed one where mpicc is, else a stand-in with what the declarations name
mpiflags=$(mpicc -showme:compile 2>/dev/null || mpicc -compile-info 2>/dev/null | cut -d' ' -f2-)
[ -z "$mpiflags" ] || mpiflags="$mpiflags -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX"
if [ -z "$mpiflags" ]; then
  printf 'typedef int MPI_Comm;\n#define MPI_COMM_NULL 0\n' > "$dir/mpi/mpi.h"
  mpiflags="-I$dir/mpi"
fi
pass=0; fail=0
# one compile: header, compiler, expect (fail|ok)
one() {
  h=$1; cc=$2; want=$3; where=$4
  printf '#include "%s"\nint pp_skew_probe;\n' "$h" > "$where/probe.c"
  case $cc in
    nvcc) cmd="nvcc -std=c++17 -x cu" ;;
    g++) cmd="g++ -std=c++11 -Wall -Wextra -Werror -x c++" ;;
    *) cmd="$cc -std=c99 -Wall -Wextra -Werror -pedantic -D_POSIX_C_SOURCE=200809L" ;;
  esac
  extra=""
  [ "$h" = pipeline_mpi.h ] && extra="$mpiflags"
  [ "$cc" = nvcc ] || extra="$extra -Itests/fakenccl -Itests/fakecuda"
  out=$($cmd $extra -c "$where/probe.c" -o "$where/probe.o" 2>&1); rc=$?
  if [ "$want" = ok ]; then
    if [ $rc -eq 0 ]; then pass=$((pass + 1)); else
      printf '%s\n' "$out" | head -20; echo "version_skew: FAILED, $h ($cc) does not compile against its own pipeline.h"; fail=$((fail + 1)); fi
    return
  fi
  if [ $rc -eq 0 ]; then echo "version_skew: FAILED, $h ($cc) compiled against pipeline.h $other"; fail=$((fail + 1)); return; fi
  # the message: this header's version and pipeline.h's, both
  if printf '%s\n' "$out" | grep -q "error.*$h $ours (PP_VERSION [0-9]*) and pipeline.h differ in version" &&
     printf '%s\n' "$out" | grep -q "pipeline.h is version $other but $h is $ours"; then
    pass=$((pass + 1))
    [ "$h" = pipeline_nccl.h ] && [ "$cc" = gcc ] && printf '%s\n' "$out" | grep "error" | sed 's/^/  /'
  else
    printf '%s\n' "$out" | head -20; echo "version_skew: FAILED, $h ($cc): the message does not name $ours and $other"; fail=$((fail + 1))
  fi
}
for h in pipeline_cuda.h pipeline_nccl.h pipeline_mpi.h; do
  for cc in gcc clang g++; do
    command -v $cc >/dev/null 2>&1 || { echo "version_skew: $cc not found, skipped"; continue; }
    one $h $cc fail "$dir/skew-$h"
    one $h $cc ok "$dir/same"
  done
done
if command -v nvcc >/dev/null 2>&1; then
  one pipeline_cuda.h nvcc fail "$dir/skew-pipeline_cuda.h"
  one pipeline_cuda.h nvcc ok "$dir/same"
else echo "version_skew: nvcc not found, its case skipped"; fi
echo "version_skew: a companion header against pipeline.h $other fails to compile naming both versions; against $ours it compiles"
echo "version_skew: $pass passed, $fail failed"
[ $fail -eq 0 ]
