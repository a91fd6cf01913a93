#!/bin/sh
# SIGKILL during sharded saves: each trial trains a fresh data-parallel run
# that saves after every step into a store keeping 2 (async saves in odd
# trials), while one rank kills itself inside one of the later saves
# (test_ckpt_sharded churn: a timer armed as that save starts, a random
# fraction of a measured save later), then checks the store at another
# world size (test_ckpt_sharded check):
# every checkpoint left verifies, the newest loads with the uninterrupted
# run's state, and the run saves again.
#
# usage: ckpt_kill.sh MPIEXEC TEST_BINARY DIR KILLED_TRIALS
# Runs until KILLED_TRIALS trials were killed (at most twice as many trials:
# a run may outlive its timer). Killed means exit 137: Open MPI 4.1's
# mpiexec exits with 128 + the signal of a rank that died of one (and says
# "exited on signal 9 (Killed)"). Exit 1 on any failed run or check, on any
# other exit status, on too few kills, or when, in either mode, fewer than
# half of its kills came in the middle of a save, as the phase the victim
# kept in DIR/phase says: sync, inside llmt_trainer_save (S, or W or C
# should the wrappers below it ever see a sync save; or a step-N.tmp-* left
# of a step newer than the newest checkpoint, which a rotation's tmp is
# not); async, inside its writer or the close (W or C: the agreement and
# rank 0's commit). And when no sync kill left such a step-N.tmp-* (the
# partial store the check must recover from).
set -u
# When a rank dies, mpiexec sends the others SIGTERM and by default waits
# 1 s (odls_base_sigkill_timeout) before their SIGKILL: 0 ends each killed
# trial at once (about 1 s a trial; still exit 137, the store left as is).
export OMPI_MCA_odls_base_sigkill_timeout=0
mpiexec=$1 bin=$2 dir=$3 want=$4
rm -rf "$dir" && mkdir -p "$dir" || exit 1
killed=0 trial=0 failed=0 start=$(date +%s)
killed_sync=0 mid_sync=0 tmp_sync=0 killed_async=0 mid_async=0
while [ "$killed" -lt "$want" ] && [ "$trial" -lt $((want * 2)) ]; do
    trial=$((trial + 1))
    rm -rf "$dir/ckpt" "$dir/phase"
    save_np=$((trial % 3 + 2))  # 2, 3 or 4 ranks save
    load_np=$((trial % 4 + 1))  # 1 to 4 ranks check
    saves=sync
    [ $((trial % 2)) -eq 1 ] && saves=async  # the churn's choice for an odd seed
    "$mpiexec" -n "$save_np" "$bin" churn "$dir" "$trial" >"$dir/churn.log" 2>&1
    rc=$?
    # The newest checkpoint's step and the newest step-N.tmp-*'s (0: none).
    newest=$(ls "$dir/ckpt" 2>/dev/null | sed -n 's/^step-0*\([0-9][0-9]*\)$/\1/p' |
        sort -n | tail -1)
    tmp=$(ls "$dir/ckpt" 2>/dev/null | sed -n 's/^step-0*\([0-9][0-9]*\)\.tmp-.*/\1/p' |
        sort -n | tail -1)
    phase=$(cat "$dir/phase" 2>/dev/null)
    partial=0
    [ "${tmp:-0}" -gt "${newest:-0}" ] && partial=1
    if [ "$rc" -eq 137 ] && [ "$saves" = sync ]; then
        killed=$((killed + 1)) killed_sync=$((killed_sync + 1))
        tmp_sync=$((tmp_sync + partial))
        case "$phase$partial" in S* | W* | C* | *1) mid_sync=$((mid_sync + 1)) ;; esac
    elif [ "$rc" -eq 137 ]; then
        killed=$((killed + 1)) killed_async=$((killed_async + 1))
        case "$phase" in W|C) mid_async=$((mid_async + 1)) ;; esac
    elif [ "$rc" -ne 0 ]; then
        echo "trial $trial: the run failed (exit $rc, not 137 for SIGKILL):"
        cat "$dir/churn.log"
        failed=1
    fi
    if "$mpiexec" -n "$load_np" "$bin" check "$dir" >"$dir/check.log" 2>&1; then
        echo "trial $trial: $saves saves on $save_np ranks (exit $rc, partial $partial," \
            "phase ${phase:--}), checked on $load_np:" \
            "$(grep -o 'resumed from step -*[0-9]*' "$dir/check.log")"
    else
        echo "trial $trial: $saves saves on $save_np ranks (exit $rc), checked on $load_np: FAILED"
        cat "$dir/check.log"
        failed=1
    fi
done
echo "$killed of $trial trials killed a rank: sync $mid_sync of $killed_sync in the middle" \
    "of a save ($tmp_sync left its step-N.tmp), async $mid_async of $killed_async in a writer" \
    "or commit" \
    "($(($(date +%s) - start)) s)"
if [ "$killed" -ge "$want" ] && [ $((mid_sync * 2)) -lt "$killed_sync" ]; then
    echo "FAILED: fewer than half of the sync kills came in the middle of a save"
    failed=1
fi
if [ "$killed" -ge "$want" ] && [ "$killed_sync" -gt 0 ] && [ "$tmp_sync" -eq 0 ]; then
    echo "FAILED: no sync kill left a partial save (a step-N.tmp-*)"
    failed=1
fi
if [ "$killed" -ge "$want" ] && [ $((mid_async * 2)) -lt "$killed_async" ]; then
    echo "FAILED: fewer than half of the async kills came in a writer or the commit"
    failed=1
fi
[ "$failed" -eq 0 ] && [ "$killed" -ge "$want" ]
