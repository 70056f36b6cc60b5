/* The profiler's draw of the gap to the next sample (profile.c,
 * next_interval; docs/PROFILING.md, "The sampler"): -ln u for a uniform u,
 * which times the rate is an exponential of that mean. Its own header so
 * that a test (tests/test_profile_draw.c) checks it against libm's log for
 * every cell of its table.
 *
 * u is k 2^-53, k an integer in [1, 2^53] (so u is in (0, 1]). With k =
 * m 2^e (m in [1, 2), e its top bit's place: both exact), -ln(k 2^-53) =
 * (53 - e) ln 2 - ln m, and ln m = ln c + ln(1 + r), c the centre of m's
 * cell (the 6 bits after its leading one), r = m / c - 1 (|r| < 1/128),
 * ln(1 + r) by the series r - r^2/2 + r^3/3 - r^4/4 (error below r^5 / 5
 * < 6e-12). So the result is -ln u within about 1e-11 for every k (the
 * test asserts 1e-10): the exponential's distribution is kept far below
 * what any count of samples resolves, with no division and no loop. */
#ifndef CORAL_PROFILE_DRAW_H
#define CORAL_PROFILE_DRAW_H

#include <stdint.h>
#include <string.h>

#define CORAL_DRAW_CELL_BITS 6
#define CORAL_DRAW_CELLS (1u << CORAL_DRAW_CELL_BITS)

/* -ln(k 2^-53), k in [1, 2^53]; 0 or a little below (within the series'
 * error) for k = 2^53. */
static inline double coral_profile_minus_ln_uniform(uint64_t k) {
    /* 1/c and ln c for each cell, c = 1 + (i + 1/2) / 64, each the double
     * nearest the exact value (made with 50-digit decimals); read-only
     * data, so a process that profiles writes no page for it. */
    static const struct {
        double inv_c, ln_c;
    } cells[CORAL_DRAW_CELLS] = {
        {0x1.fc07f01fc07f0p-1, 0x1.fe02a6b106789p-8}, /* c = 1 + 1/128 */
        {0x1.f44659e4a4271p-1, 0x1.7b91b07d5b11bp-6}, /* c = 1 + 3/128 */
        {0x1.ecc07b301ecc0p-1, 0x1.39e87b9febd60p-5}, /* c = 1 + 5/128 */
        {0x1.e573ac901e574p-1, 0x1.b42dd711971bfp-5}, /* c = 1 + 7/128 */
        {0x1.de5d6e3f8868ap-1, 0x1.16536eea37ae1p-4}, /* c = 1 + 9/128 */
        {0x1.d77b654b82c34p-1, 0x1.51b073f06183fp-4}, /* c = 1 + 11/128 */
        {0x1.d0cb58f6ec074p-1, 0x1.8c345d6319b21p-4}, /* c = 1 + 13/128 */
        {0x1.ca4b3055ee191p-1, 0x1.c5e548f5bc743p-4}, /* c = 1 + 15/128 */
        {0x1.c3f8f01c3f8f0p-1, 0x1.fec9131dbeabbp-4}, /* c = 1 + 17/128 */
        {0x1.bdd2b899406f7p-1, 0x1.1b72ad52f67a0p-3}, /* c = 1 + 19/128 */
        {0x1.b7d6c3dda338bp-1, 0x1.371fc201e8f74p-3}, /* c = 1 + 21/128 */
        {0x1.b2036406c80d9p-1, 0x1.526e5e3a1b438p-3}, /* c = 1 + 23/128 */
        {0x1.ac5701ac5701bp-1, 0x1.6d60fe719d21dp-3}, /* c = 1 + 25/128 */
        {0x1.a6d01a6d01a6dp-1, 0x1.87fa06520c911p-3}, /* c = 1 + 27/128 */
        {0x1.a16d3f97a4b02p-1, 0x1.a23bc1fe2b563p-3}, /* c = 1 + 29/128 */
        {0x1.9c2d14ee4a102p-1, 0x1.bc286742d8cd6p-3}, /* c = 1 + 31/128 */
        {0x1.970e4f80cb872p-1, 0x1.d5c216b4fbb91p-3}, /* c = 1 + 33/128 */
        {0x1.920fb49d0e229p-1, 0x1.ef0adcbdc5936p-3}, /* c = 1 + 35/128 */
        {0x1.8d3018d3018d3p-1, 0x1.0402594b4d041p-2}, /* c = 1 + 37/128 */
        {0x1.886e5f0abb04ap-1, 0x1.1058bf9ae4ad5p-2}, /* c = 1 + 39/128 */
        {0x1.83c977ab2beddp-1, 0x1.1c898c16999fbp-2}, /* c = 1 + 41/128 */
        {0x1.7f405fd017f40p-1, 0x1.2895a13de86a3p-2}, /* c = 1 + 43/128 */
        {0x1.7ad2208e0ecc3p-1, 0x1.347dd9a987d55p-2}, /* c = 1 + 45/128 */
        {0x1.767dce434a9b1p-1, 0x1.404308686a7e4p-2}, /* c = 1 + 47/128 */
        {0x1.724287f46debcp-1, 0x1.4be5f957778a1p-2}, /* c = 1 + 49/128 */
        {0x1.6e1f76b4337c7p-1, 0x1.5767717455a6cp-2}, /* c = 1 + 51/128 */
        {0x1.6a13cd1537290p-1, 0x1.62c82f2b9c795p-2}, /* c = 1 + 53/128 */
        {0x1.661ec6a5122f9p-1, 0x1.6e08eaa2ba1e4p-2}, /* c = 1 + 55/128 */
        {0x1.623fa77016240p-1, 0x1.792a55fdd47a2p-2}, /* c = 1 + 57/128 */
        {0x1.5e75bb8d015e7p-1, 0x1.842d1da1e8b17p-2}, /* c = 1 + 59/128 */
        {0x1.5ac056b015ac0p-1, 0x1.8f11e873662c7p-2}, /* c = 1 + 61/128 */
        {0x1.571ed3c506b3ap-1, 0x1.99d958117e08bp-2}, /* c = 1 + 63/128 */
        {0x1.5390948f40febp-1, 0x1.a484090e5bb0ap-2}, /* c = 1 + 65/128 */
        {0x1.5015015015015p-1, 0x1.af1293247786bp-2}, /* c = 1 + 67/128 */
        {0x1.4cab88725af6ep-1, 0x1.b9858969310fbp-2}, /* c = 1 + 69/128 */
        {0x1.49539e3b2d067p-1, 0x1.c3dd7a7cdad4dp-2}, /* c = 1 + 71/128 */
        {0x1.460cbc7f5cf9ap-1, 0x1.ce1af0b85f3ebp-2}, /* c = 1 + 73/128 */
        {0x1.42d6625d51f87p-1, 0x1.d83e7258a2f3ep-2}, /* c = 1 + 75/128 */
        {0x1.3fb013fb013fbp-1, 0x1.e24881a7c6c26p-2}, /* c = 1 + 77/128 */
        {0x1.3c995a47babe7p-1, 0x1.ec399d2468cc0p-2}, /* c = 1 + 79/128 */
        {0x1.3991c2c187f63p-1, 0x1.f6123fa7028acp-2}, /* c = 1 + 81/128 */
        {0x1.3698df3de0748p-1, 0x1.ffd2e0857f498p-2}, /* c = 1 + 83/128 */
        {0x1.33ae45b57bcb2p-1, 0x1.04bdf9da926d2p-1}, /* c = 1 + 85/128 */
        {0x1.30d190130d190p-1, 0x1.0986f4f573521p-1}, /* c = 1 + 87/128 */
        {0x1.2e025c04b8097p-1, 0x1.0e44985d1cc8cp-1}, /* c = 1 + 89/128 */
        {0x1.2b404ad012b40p-1, 0x1.12f719593efbcp-1}, /* c = 1 + 91/128 */
        {0x1.288b01288b013p-1, 0x1.179eabbd899a1p-1}, /* c = 1 + 93/128 */
        {0x1.25e22708092f1p-1, 0x1.1c3b81f713c25p-1}, /* c = 1 + 95/128 */
        {0x1.23456789abcdfp-1, 0x1.20cdcd192ab6ep-1}, /* c = 1 + 97/128 */
        {0x1.20b470c67c0d9p-1, 0x1.2555bce98f7cbp-1}, /* c = 1 + 99/128 */
        {0x1.1e2ef3b3fb874p-1, 0x1.29d37fec2b08bp-1}, /* c = 1 + 101/128 */
        {0x1.1bb4a4046ed29p-1, 0x1.2e47436e40268p-1}, /* c = 1 + 103/128 */
        {0x1.19453808ca29cp-1, 0x1.32b1339121d71p-1}, /* c = 1 + 105/128 */
        {0x1.16e0689427379p-1, 0x1.37117b54747b6p-1}, /* c = 1 + 107/128 */
        {0x1.1485f0e0acd3bp-1, 0x1.3b68449fffc23p-1}, /* c = 1 + 109/128 */
        {0x1.12358e75d3033p-1, 0x1.3fb5b84d16f42p-1}, /* c = 1 + 111/128 */
        {0x1.0fef010fef011p-1, 0x1.43f9fe2f9ce67p-1}, /* c = 1 + 113/128 */
        {0x1.0db20a88f4696p-1, 0x1.48353d1ea88dfp-1}, /* c = 1 + 115/128 */
        {0x1.0b7e6ec259dc8p-1, 0x1.4c679afccee3ap-1}, /* c = 1 + 117/128 */
        {0x1.0953f39010954p-1, 0x1.50913cc01686bp-1}, /* c = 1 + 119/128 */
        {0x1.073260a47f7c6p-1, 0x1.54b2467999498p-1}, /* c = 1 + 121/128 */
        {0x1.05197f7d73404p-1, 0x1.58cadb5cd7989p-1}, /* c = 1 + 123/128 */
        {0x1.03091b51f5e1ap-1, 0x1.5cdb1dc6c1765p-1}, /* c = 1 + 125/128 */
        {0x1.0101010101010p-1, 0x1.60e32f44788d9p-1}, /* c = 1 + 127/128 */
    };
    _Static_assert(sizeof cells / sizeof cells[0] == CORAL_DRAW_CELLS, "a row per cell");
    double kd = (double)k; /* (exact: k <= 2^53) */
    uint64_t bits;
    memcpy(&bits, &kd, sizeof bits);
    int e = (int)(bits >> 52) - 1023;
    unsigned cell = (unsigned)(bits >> (52 - CORAL_DRAW_CELL_BITS)) & (CORAL_DRAW_CELLS - 1);
    bits = (bits & (((uint64_t)1 << 52) - 1)) | ((uint64_t)1023 << 52);
    double m;
    memcpy(&m, &bits, sizeof m);
    double r = m * cells[cell].inv_c - 1.0;
    double ln_1r = r * (1.0 - r * (0.5 - r * (1.0 / 3 - r * 0.25)));
    return (53 - e) * 0.6931471805599453 - (cells[cell].ln_c + ln_1r);
}

#endif
