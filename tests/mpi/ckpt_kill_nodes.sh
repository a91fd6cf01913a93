#!/bin/sh
# SIGKILL during saves to a fast tier local to each node: each trial trains a
# fresh data-parallel run of 2 to 4 ranks on two simulated nodes (ranks
# [0, n/2) on node A, the rest on B: test_ckpt_sharded churn-nodes) that
# saves to the fast tier after every step and to the durable one every 3,
# while one rank kills itself inside one of the fast saves (odd seeds:
# inside its close: in the commits, the other nodes' leaders' before rank 0's).
# Then test_ckpt_sharded check-nodes checks a copy with the ranks at another
# world size or layout, and the trial's own store with the ranks where they
# were: every rank resumes the newest checkpoint whose files it finds on
# its node, with the uninterrupted run's state, and the run saves again.
#
# usage: ckpt_kill_nodes.sh MPIEXEC TEST_BINARY DIR KILLED_TRIALS [SEEDS_FROM]
# (DIR absolute). Trial t's churn gets the seed SEEDS_FROM + t (default 0:
# ctest's trials are the same each run; another value tries other victims,
# saves and instants). Runs until KILLED_TRIALS trials were killed (at most
# twice as many trials).
# Killed means exit 137 (as in ckpt_kill.sh). Exit 1 on any failed run or
# check, on any other exit status, on too few kills, or when fewer than half
# of the kills came in the middle of a fast save: a step-N.tmp-* left on a
# node newer than rank 0's newest fast checkpoint, or the victim's phase (in
# DIR/nodes/phase) W (before the commits) or C (in them).
set -u
# When a rank dies, mpiexec sends the others SIGTERM and by default waits
# 1 s (odls_base_sigkill_timeout) before their SIGKILL: 0 ends each killed
# trial at once (about 1 s a trial; still exit 137, the store left as is).
export OMPI_MCA_odls_base_sigkill_timeout=0
mpiexec=$1 bin=$2 dir=$3 want=$4 seeds_from=${5:-0}
rm -rf "$dir" && mkdir -p "$dir" || exit 1

# The layout of n ranks: [0, n/2) on node A, the rest on B ($2 = swap: the
# other way round).
layout() {
    i=0 out=
    while [ "$i" -lt "$1" ]; do
        if [ "$i" -lt $(($1 / 2)) ]; then out=${out}A; else out=${out}B; fi
        i=$((i + 1))
    done
    [ "${2:-}" = swap ] && out=$(echo "$out" | tr AB BA)
    echo "$out"
}

# The newest step of the checkpoints (step-N) or, with tmp, of the step-N.tmp-*
# in the given directories (empty: none).
newest() {
    what=$1
    shift
    if [ "$what" = tmp ]; then pattern='s/^step-0*\([0-9][0-9]*\)\.tmp-.*/\1/p'
    else pattern='s/^step-0*\([0-9][0-9]*\)$/\1/p'; fi
    for d in "$@"; do ls "$d" 2>/dev/null; done | sed -n "$pattern" | sort -n | tail -1
}

# check TAG NP LAYOUT: test_ckpt_sharded check-nodes of DIR/TAG on NP ranks
# laid out as LAYOUT (the churn's: $saved); its outcome appended to $line.
check() {
    if "$mpiexec" -n "$2" "$bin" check-nodes "$dir" "$1" "$3" "$saved" \
        >"$dir/check.log" 2>&1; then
        line="$line, on $3: $(grep -o 'resumed from step .*' "$dir/check.log")"
    else
        line="$line, on $3: FAILED"
        cat "$dir/check.log"
        failed=1
    fi
}

killed=0 trial=0 failed=0 mid=0 commits=0 start=$(date +%s)
while [ "$killed" -lt "$want" ] && [ "$trial" -lt $((want * 2)) ]; do
    trial=$((trial + 1))
    rm -rf "$dir/nodes" "$dir/moved"
    save_np=$((trial % 3 + 2))  # 2, 3 or 4 ranks save
    load_np=$((trial % 4 + 1))  # 1 to 4 ranks check at another layout
    saved=$(layout "$save_np")
    swap=
    [ $((trial / 4 % 2)) -eq 1 ] && swap=swap
    other=$(layout "$load_np" "$swap")
    [ "$other" = "$saved" ] && other=$(layout "$load_np" swap)
    "$mpiexec" -n "$save_np" "$bin" churn-nodes "$dir" $((seeds_from + trial)) "$saved" \
        >"$dir/churn.log" 2>&1
    rc=$?
    fast=$(newest step "$dir/nodes/A/fast")  # rank 0's node
    tmp=$(newest tmp "$dir/nodes/A/fast" "$dir/nodes/B/fast")
    phase=$(cat "$dir/nodes/phase" 2>/dev/null)
    partial=0
    [ "${tmp:-0}" -gt "${fast:-0}" ] && partial=1
    if [ "$rc" -eq 137 ]; then
        killed=$((killed + 1))
        case "$phase" in
        W) mid=$((mid + 1)) ;;
        C) mid=$((mid + 1)) commits=$((commits + 1)) ;;
        *) mid=$((mid + partial)) ;;
        esac
    elif [ "$rc" -ne 0 ]; then
        echo "trial $trial: the run failed (exit $rc, not 137 for SIGKILL):"
        cat "$dir/churn.log"
        failed=1
    fi
    line="trial $trial: fast saves on $saved (exit $rc, partial $partial, phase ${phase:--})"
    cp -a "$dir/nodes" "$dir/moved" || exit 1
    check moved "$load_np" "$other"
    check nodes "$save_np" "$saved"
    echo "$line"
done
echo "$killed of $trial trials killed a rank: $mid in the middle of a fast save" \
    "($commits in the commits) ($(($(date +%s) - start)) s)"
if [ "$killed" -ge "$want" ] && [ $((mid * 2)) -lt "$killed" ]; then
    echo "FAILED: fewer than half of the kills came in the middle of a fast save"
    failed=1
fi
[ "$failed" -eq 0 ] && [ "$killed" -ge "$want" ]
