#!/bin/sh
# tools/nccl_local.sh N CMD [ARGS...]: N processes of CMD on this machine, each told its place as
# torchrun tells it (RANK, WORLD_SIZE, LOCAL_RANK: pp_launch_from_env reads them); exits 0 when all
# did. A signal (timeout's) goes on to every process.
n=${1:?usage: tools/nccl_local.sh N CMD [ARGS...]}
shift
pids=""
trap 'kill $pids 2>/dev/null; exit 124' TERM INT
i=0
while [ "$i" -lt "$n" ]; do
    RANK=$i WORLD_SIZE=$n LOCAL_RANK=$i LOCAL_WORLD_SIZE=$n "$@" &
    pids="$pids $!"
    i=$((i + 1))
done
rc=0
for p in $pids; do wait "$p" || rc=1; done
exit $rc
