# tests/gpt_script.sh - what the GPT trainer scripts share, sourced by tests/test_resume.sh and
# tests/test_trainer.sh after they set kind (resume, trainer). Their arguments, GPT_CPU [GPT_MPI
# MPIRUN...], become cpu and mpi, and the mpirun command stays in "$@"; name says which run
# (gpt-KIND, or mpi-KIND over MPI), tmp is the files' prefix; check counts a condition, and
# finish removes the files, prints "NAME: N passed, N failed" and is the script's exit status.
cpu=${1:-build/gpt_cpu}
mpi=$2
[ $# -ge 2 ] && shift 2
name=gpt-$kind
[ -n "$mpi" ] && name=mpi-$kind
tmp=${TMPDIR:-/tmp}/pp-$kind-test.$$
pass=0; fail=0
check() { # check WHAT COND: COND evaluated; false counts a failure, says WHAT and returns 1
    if eval "$2"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL $1"; return 1; fi
}
finish() {
    rm -f "$tmp".*
    echo "$name: $pass passed, $fail failed"
    [ $fail -eq 0 ]
}
