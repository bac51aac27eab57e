#!/bin/sh
# A consumer project through every route a user takes, each building and running the README's
# quick start (a two-stage pipeline) and, where the route provides them, the companion headers
# (tests/consumer/companions.c against pipeline-cuda/-nccl/-mpi or pipeline::cuda/nccl/mpi):
#   1. make install PREFIX=<tmp>, then pkg-config --cflags/--libs pipeline (and the companions'
#      .pc files make install wrote); pp-sched from the prefix; find_package(pipeline) through the
#      CMake package make install wrote there; make uninstall leaves nothing; a DESTDIR install
#      lands under DESTDIR with the prefix's paths in its .pc files
#   2. the installed CMake package: cmake --install into <tmp>, then find_package(pipeline)
#   3. add_subdirectory of this checkout
#   4. FetchContent from an archive of this checkout's files (tracked and untracked, not ignored)
# Needs cmake and pkg-config (make check-install says so and skips without them).
# usage: sh tests/check_install.sh [BUILD_DIR]       ends "N passed, N failed"
B=${1:-build}
MAKE=${MAKE:-make}
# make install and uninstall run here on their own: no flags or variables of a make around us
unset MAKEFLAGS MAKELEVEL MFLAGS
top=$(pwd)
dir=$top/$B/check-install.d
rm -rf "$dir" && mkdir -p "$dir" || exit 1
pass=0; fail=0
ok() { pass=$((pass + 1)); [ -z "$1" ] || echo "check-install: $1"; }
bad() { echo "check-install: FAILED, $1"; fail=$((fail + 1)); }
quiet() { log=$dir/last.log; if "$@" > "$log" 2>&1; then return 0; else tail -25 "$log"; return 1; fi; }
for t in cmake pkg-config; do command -v $t >/dev/null 2>&1 || { echo "check-install: $t not found"; echo "check-install: 0 passed, 1 failed"; exit 1; }; done
sh tests/readme_quickstart.sh --extract "$dir/quickstart.c" || { echo "check-install: 0 passed, 1 failed"; exit 1; }
STRICT="-std=c99 -Wall -Wextra -Werror -pedantic"

consumer() { # what (in the messages), route, build dir, extra cmake arguments...
  what=$1; route=$2; bdir=$3; shift 3
  if ! quiet cmake -S tests/consumer -B "$bdir" -DPIPELINE_ROUTE=$route -DQUICKSTART="$dir/quickstart.c" "$@"; then
    bad "cmake configure of the consumer ($what)"; return; fi
  if ! quiet cmake --build "$bdir" -j 2; then bad "cmake build of the consumer ($what)"; return; fi
  if out=$("$bdir/quickstart"); then ok "$what: $out"; else bad "the quick start built through $what"; fi
  comps=$(cat "$bdir/companions.txt")
  for c in $comps; do
    if quiet "$bdir/companion_$c"; then ok; else bad "companion_$c ($what)"; fi
  done
  echo "check-install: $what: pipeline::pipeline${comps:+, and companions.c through}$(for c in $comps; do printf ' pipeline::%s' $c; done)"
}

# -- 1. make install, pkg-config ------------------------------------------------------------------
prefix=$dir/prefix
if quiet $MAKE --no-print-directory B="$B" install PREFIX="$prefix"; then ok; else bad "make install PREFIX=$prefix"; fi
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
if [ "$(pkg-config --modversion pipeline 2>/dev/null)" = "$(sed -n 's/^#define PP_VERSION_STRING "\(.*\)"/\1/p' pipeline.h)" ]; then ok
else bad "pkg-config --modversion pipeline: '$(pkg-config --modversion pipeline 2>&1)'"; fi
if quiet ${CC:-cc} $STRICT $(pkg-config --cflags pipeline) "$dir/quickstart.c" -o "$dir/pc-quickstart" $(pkg-config --libs pipeline) &&
   out=$("$dir/pc-quickstart"); then ok "pkg-config: the quick start built with \$(pkg-config --cflags --libs pipeline): $out"
else bad "the quick start through pkg-config"; fi
pcs=""
for c in cuda nccl mpi; do
  pkg-config --exists pipeline-$c 2>/dev/null || continue
  C=$(echo $c | tr a-z A-Z)
  if quiet ${CC:-cc} $STRICT -DPP_CONSUMER_$C $(pkg-config --cflags pipeline-$c) tests/consumer/companions.c -o "$dir/pc-$c" \
       $(pkg-config --libs pipeline-$c) && quiet "$dir/pc-$c"; then ok; pcs="$pcs pipeline-$c"
  else bad "companions.c through pkg-config pipeline-$c"; fi
done
[ -z "$pcs" ] || echo "check-install: pkg-config: companions.c built and ran through$pcs"
if quiet "$prefix/bin/pp-sched" 1f1b -p 2 -m 4; then ok; else bad "pp-sched from the prefix"; fi
# the CMake package make install wrote beside them: find_package(pipeline) against the prefix
if [ -f "$prefix/lib/cmake/pipeline/pipelineConfig.cmake" ]; then ok
  consumer "make install, find_package" find_package "$dir/consumer-make" -DCMAKE_PREFIX_PATH="$prefix"
else bad "make install wrote no $prefix/lib/cmake/pipeline/pipelineConfig.cmake"; fi
if quiet $MAKE --no-print-directory B="$B" uninstall PREFIX="$prefix" && [ -z "$(find "$prefix" -type f)" ]; then ok
else bad "make uninstall left: $(find "$prefix" -type f | head -5)"; fi
stage=$dir/stage
if quiet $MAKE --no-print-directory B="$B" install DESTDIR="$stage" PREFIX=/opt/pp && [ -f "$stage/opt/pp/include/pipeline/pipeline.h" ] &&
   grep -q '^prefix=/opt/pp$' "$stage/opt/pp/lib/pkgconfig/pipeline.pc" &&
   quiet $MAKE --no-print-directory B="$B" uninstall DESTDIR="$stage" PREFIX=/opt/pp && [ -z "$(find "$stage" -type f)" ]; then ok
else bad "make install/uninstall DESTDIR=$stage PREFIX=/opt/pp"; fi
unset PKG_CONFIG_PATH

# -- 2-4. CMake: the consumer project three ways -------------------------------------------------
cprefix=$dir/cmake-prefix
if quiet cmake -S . -B "$dir/cmake-build" -DCMAKE_INSTALL_PREFIX="$cprefix" && quiet cmake --build "$dir/cmake-build" -j 2 &&
   quiet cmake --install "$dir/cmake-build"; then ok
  consumer find_package find_package "$dir/consumer-find" -DCMAKE_PREFIX_PATH="$cprefix"
  # what find_package refuses, with its reason: a component there is none of, a later version
  if cmake -S tests/consumer -B "$dir/consumer-nocomp" -DPIPELINE_ROUTE=find_package -DCMAKE_PREFIX_PATH="$cprefix" \
       -DQUICKSTART="$dir/quickstart.c" -DPIPELINE_COMPONENTS="cuda;bogus" > "$dir/nocomp.log" 2>&1; then
    bad "find_package(pipeline REQUIRED COMPONENTS cuda bogus) succeeded"
  elif grep -q "pipeline has no component bogus" "$dir/nocomp.log"; then ok
  else tail -20 "$dir/nocomp.log"; bad "find_package(pipeline REQUIRED COMPONENTS bogus) failed without naming it"; fi
  if cmake -S tests/consumer -B "$dir/consumer-later" -DPIPELINE_ROUTE=find_package -DCMAKE_PREFIX_PATH="$cprefix" \
       -DQUICKSTART="$dir/quickstart.c" -DPIPELINE_VERSION_WANTED=0.99 > "$dir/later.log" 2>&1; then
    bad "find_package(pipeline 0.99) succeeded"
  elif grep -q "0.99" "$dir/later.log"; then ok
  else tail -20 "$dir/later.log"; bad "find_package(pipeline 0.99) failed without naming the version"; fi
else bad "cmake build and install of pipeline into $cprefix"; fi
consumer subdirectory subdirectory "$dir/consumer-subdir" -DPIPELINE_SOURCE_DIR="$top"
# what a release archive holds: the checkout's files as git sees them (a plain copy without git)
src=$dir/pipeline-src.tar.gz
if command -v git >/dev/null 2>&1 && git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -co --exclude-standard | tar -czf "$src" -T - || bad "archive of the checkout"
else
  tar --exclude="./$B" --exclude=./.git -czf "$src" . || bad "archive of the checkout"
fi
consumer fetchcontent fetchcontent "$dir/consumer-fetch" -DPIPELINE_URL="$src"
echo "check-install: $pass passed, $fail failed"
[ $fail -eq 0 ]
