/* The side-by-side summary of the checkpoint benchmarks (bench_ckpt,
 * bench_ckpt_dp): our time and a plain reference's, measured in R
 * interleaved rounds whose order alternates (round 1 plain first). */
#ifndef LLMT_BENCH_RATIO_H
#define LLMT_BENCH_RATIO_H

#include <stdio.h>

#include "bench_util.h"

#define BENCH_MAX_ROUNDS 50

/* Prints each side's min and median over the rounds (and the rate of gb
 * GB at the median), the median and min of the per-round ratios plain /
 * ours (> 1: we are faster), and those of the order-balanced pairs: rounds
 * 2k+1 and 2k+2 (one of each order) summed, plain / ours, which cancels
 * an advantage of going first or second (on this VM's disk, the second
 * writer often reuses the blocks the first just freed). Returns our median. */
static inline double bench_ratio_summary(const char *ours_name, const double *ours,
                                         const char *plain_name, const double *plain, int rounds,
                                         double gb)
{
    double o[BENCH_MAX_ROUNDS], p[BENCH_MAX_ROUNDS], ratio[BENCH_MAX_ROUNDS];
    double pair[BENCH_MAX_ROUNDS / 2];
    for (int r = 0; r < rounds; r++) {
        o[r] = ours[r];
        p[r] = plain[r];
        ratio[r] = plain[r] / ours[r];
    }
    int pairs = rounds / 2;
    for (int k = 0; k < pairs; k++)
        pair[k] = (plain[2 * k] + plain[2 * k + 1]) / (ours[2 * k] + ours[2 * k + 1]);
    /* bench_median sorts: [0] is then the min. */
    double o_med = bench_median(o, rounds), p_med = bench_median(p, rounds);
    double r_med = bench_median(ratio, rounds);
    printf("%-13s min %6.2f s  median %6.2f s (%5.2f GB/s) | %-17s min %6.2f s  median %6.2f s "
           "(%5.2f GB/s) | ratio per round: median %.2f  min %.2f", ours_name, o[0], o_med,
           gb / o_med, plain_name, p[0], p_med, gb / p_med, r_med, ratio[0]);
    if (pairs) {
        double pair_med = bench_median(pair, pairs);
        printf(" | per pair of rounds: median %.2f  min %.2f", pair_med, pair[0]);
    }
    printf("\n");
    return o_med;
}

#endif
