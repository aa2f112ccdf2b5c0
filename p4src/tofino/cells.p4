/* Cells per packet of the TNA program and FOR_EACH_PAIR(M). The cells live in pair
 * registers: pair p holds cells 2p (its lo word) and 2p+1 (its hi word), so one stateful
 * ALU combines 8 bytes of a packet. M(p, a, b) expands for each pair p with a = 2p and
 * b = 2p + 1. 64 cells (32 pairs, 256 bytes) is the default: every stateful ALU of the
 * stages after the slot state holds a pair (docs/tofino.md). A build option:
 * -DTNA_CELLS=N for N in 16, 32, 48 or 64. */
#ifndef HOMAGG_TNA_CELLS_P4
#define HOMAGG_TNA_CELLS_P4

#ifndef TNA_CELLS
#define TNA_CELLS 64
#endif
/* The shared headers and constants size the wire by CELLS_PER_PKT, and skip the v1model
 * program's register layout under HOMAGG_TNA. */
#define HOMAGG_TNA
#define CELLS_PER_PKT TNA_CELLS

#define PAIRS_0_7(M) M(0, 0, 1) M(1, 2, 3) M(2, 4, 5) M(3, 6, 7) \
    M(4, 8, 9) M(5, 10, 11) M(6, 12, 13) M(7, 14, 15)
#define PAIRS_8_15(M) M(8, 16, 17) M(9, 18, 19) M(10, 20, 21) M(11, 22, 23) \
    M(12, 24, 25) M(13, 26, 27) M(14, 28, 29) M(15, 30, 31)
#define PAIRS_16_23(M) M(16, 32, 33) M(17, 34, 35) M(18, 36, 37) M(19, 38, 39) \
    M(20, 40, 41) M(21, 42, 43) M(22, 44, 45) M(23, 46, 47)
#define PAIRS_24_31(M) M(24, 48, 49) M(25, 50, 51) M(26, 52, 53) M(27, 54, 55) \
    M(28, 56, 57) M(29, 58, 59) M(30, 60, 61) M(31, 62, 63)
#if TNA_CELLS == 16
#define FOR_EACH_PAIR(M) PAIRS_0_7(M)
#elif TNA_CELLS == 32
#define FOR_EACH_PAIR(M) PAIRS_0_7(M) PAIRS_8_15(M)
#elif TNA_CELLS == 48
#define FOR_EACH_PAIR(M) PAIRS_0_7(M) PAIRS_8_15(M) PAIRS_16_23(M)
#elif TNA_CELLS == 64
#define FOR_EACH_PAIR(M) PAIRS_0_7(M) PAIRS_8_15(M) PAIRS_16_23(M) PAIRS_24_31(M)
#else
#error "TNA_CELLS must be 16, 32, 48 or 64"
#endif

#endif
