#!/bin/sh
# SIGKILL during sharded saves: each trial trains a fresh data-parallel run
# that saves after every step while one rank kills itself at a random
# instant (test_ckpt_sharded churn), then checks the store at another world
# size (test_ckpt_sharded check): every checkpoint left verifies, the newest
# loads with the uninterrupted run's state, and the run saves again.
#
# usage: ckpt_kill.sh MPIEXEC TEST_BINARY DIR KILLED_TRIALS
# Runs until KILLED_TRIALS trials were killed mid-run (at most twice as many
# trials: a run may finish before its kill); exit 1 on any failed run or
# check, or too few kills.
set -u
mpiexec=$1 bin=$2 dir=$3 want=$4
rm -rf "$dir" && mkdir -p "$dir" || exit 1
killed=0 trial=0 failed=0 mid_save=0
while [ "$killed" -lt "$want" ] && [ "$trial" -lt $((want * 2)) ]; do
    trial=$((trial + 1))
    rm -rf "$dir/ckpt"
    save_np=$((trial % 3 + 2))  # 2, 3 or 4 ranks save
    load_np=$((trial % 4 + 1))  # 1 to 4 ranks check
    "$mpiexec" -n "$save_np" "$bin" churn "$dir" "$trial" >"$dir/churn.log" 2>&1
    rc=$?
    if [ "$rc" -ge 128 ]; then # the launcher reports the signal: 128 + 9
        killed=$((killed + 1))
    elif [ "$rc" -ne 0 ]; then
        echo "trial $trial: the run failed before the kill (exit $rc):"
        cat "$dir/churn.log"
        failed=1
    fi
    # A step-N.tmp-* left behind: the kill came in the middle of a save.
    partial=$(ls "$dir/ckpt" 2>/dev/null | grep -c '\.tmp-')
    [ "$partial" -gt 0 ] && mid_save=$((mid_save + 1))
    if "$mpiexec" -n "$load_np" "$bin" check "$dir" >"$dir/check.log" 2>&1; then
        echo "trial $trial: saved on $save_np ranks (exit $rc, $partial partial), checked on" \
            "$load_np: $(grep -o 'resumed from step -*[0-9]*' "$dir/check.log")"
    else
        echo "trial $trial: saved on $save_np ranks (exit $rc), checked on $load_np: FAILED"
        cat "$dir/check.log"
        failed=1
    fi
done
echo "$killed of $trial trials killed a rank, $mid_save of them in the middle of a save"
[ "$failed" -eq 0 ] && [ "$killed" -ge "$want" ]
