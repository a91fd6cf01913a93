/* fp32 <-> bf16 / fp16 conversions against an independent reference: every
 * 16-bit value decoded from its fields with ldexp, and the correctly rounded
 * (nearest, ties to even) 16-bit value of a float found by search. */
#include <math.h>
#include <stdlib.h>

#include "test_util.h"

#include "core/half.h"
#include "test_rand.h"

/* Value of a 16-bit float with e exponent bits and m mantissa bits. */
static double decode(uint16_t h, int e_bits, int m_bits)
{
    int sign = h >> 15, bias = (1 << (e_bits - 1)) - 1;
    int e = (h >> m_bits) & ((1 << e_bits) - 1), m = h & ((1 << m_bits) - 1);
    double v;
    if (e == (1 << e_bits) - 1)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(m, 1 - bias - m_bits);
    else
        v = ldexp(m + (1 << m_bits), e - bias - m_bits);
    return sign ? -v : v;
}

/* Nearest 16-bit value to x (finite x), ties to even mantissa, overflow to
 * infinity past the largest finite value plus half an ulp. */
static uint16_t reference_round(double x, int e_bits, int m_bits)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double ax = fabs(x);
    uint16_t inf = (uint16_t)(((1 << e_bits) - 1) << m_bits);
    /* Positive finite codes are ordered like their values: binary search. */
    uint16_t lo = 0, hi = (uint16_t)(inf - 1);
    if (ax >= decode(hi, e_bits, m_bits)) {
        double half_ulp = (decode(hi, e_bits, m_bits) - decode((uint16_t)(hi - 1), e_bits, m_bits)) / 2;
        return sign | (ax >= decode(hi, e_bits, m_bits) + half_ulp ? inf : hi);
    }
    while (hi - lo > 1) {
        uint16_t mid = (uint16_t)((lo + hi) / 2);
        if (decode(mid, e_bits, m_bits) <= ax)
            lo = mid;
        else
            hi = mid;
    }
    double dl = ax - decode(lo, e_bits, m_bits), dh = decode(hi, e_bits, m_bits) - ax;
    uint16_t pick = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
    return sign | pick;
}

static void test_widening_is_exact(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        double f16 = decode((uint16_t)h, 5, 10), bf = decode((uint16_t)h, 8, 7);
        float a = llmt_f16_to_f32((uint16_t)h), b = llmt_bf16_to_f32((uint16_t)h);
        if (isnan(f16))
            assert_true(isnan(a));
        else
            if (!((double)a == f16 && !signbit(a) == !signbit(f16)))
                fail_msg("f16 %04x: got %a want %a", h, (double)a, f16);
        if (isnan(bf))
            assert_true(isnan(b));
        else
            assert_true((double)b == bf);
        /* Narrowing a widened value gives it back (NaNs stay NaN). */
        if (!isnan(f16))
            assert_int_equal(llmt_f32_to_f16(a), h);
        if (!isnan(bf))
            assert_int_equal(llmt_f32_to_bf16(b), h);
    }
}

static void check_narrowing(float x)
{
    if (isnan(x)) {
        assert_true(isnan(llmt_f16_to_f32(llmt_f32_to_f16(x))));
        assert_true(isnan(llmt_bf16_to_f32(llmt_f32_to_bf16(x))));
        return;
    }
    uint16_t want16 = reference_round(x, 5, 10), wantb = reference_round(x, 8, 7);
    uint16_t got16 = llmt_f32_to_f16(x), gotb = llmt_f32_to_bf16(x);
    if (got16 != want16 || gotb != wantb)
        fail_msg("%a: f16 %04x want %04x, bf16 %04x want %04x", (double)x, got16, want16, gotb,
                 wantb);
}

static void test_narrowing_rounds_to_nearest_even(void **state)
{
    (void)state;
    uint64_t s = 77;
    /* Random bit patterns cover every exponent, including subnormals. */
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)trand_u64(&s);
        float x;
        memcpy(&x, &u, 4);
        check_narrowing(x);
    }
    /* Exact midpoints between neighbouring 16-bit values, and one float on
     * either side of each, for both formats and every exponent. */
    for (uint32_t h = 0; h < 0x7c00; h++) {
        float mid = (float)((decode((uint16_t)h, 5, 10) + decode((uint16_t)(h + 1), 5, 10)) / 2);
        check_narrowing(mid);
        check_narrowing(nextafterf(mid, 0));
        check_narrowing(nextafterf(mid, INFINITY));
        check_narrowing(-mid);
    }
    for (uint32_t h = 0; h < 0x7f80; h += 7) {
        float mid = (float)((decode((uint16_t)h, 8, 7) + decode((uint16_t)(h + 1), 8, 7)) / 2);
        check_narrowing(mid);
        check_narrowing(nextafterf(mid, 0));
        check_narrowing(nextafterf(mid, INFINITY));
    }
    check_narrowing(65520.0f); /* rounds up to fp16 infinity */
    check_narrowing(65519.996f);
    check_narrowing(INFINITY);
    check_narrowing(-INFINITY);
    check_narrowing(NAN);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_widening_is_exact),
        cmocka_unit_test(test_narrowing_rounds_to_nearest_even),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
