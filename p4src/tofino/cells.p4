/* Cells per packet of the TNA program and FOR_EACH_CELL(M), M(i) for each cell.
 * 32 cells: 32 stateful ALUs, 4 per stage, beside the slot state's registers
 * (docs/tofino.md). A build option: -DTNA_CELLS=16 for a smaller pipeline. */
#ifndef HOMAGG_TNA_CELLS_P4
#define HOMAGG_TNA_CELLS_P4

#ifndef TNA_CELLS
#define TNA_CELLS 32
#endif
/* The shared headers and constants size the wire by CELLS_PER_PKT, and skip the v1model
 * program's register layout under HOMAGG_TNA. */
#define HOMAGG_TNA
#define CELLS_PER_PKT TNA_CELLS
#define CELLS_0_15(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) \
    M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15)
#define CELLS_16_31(M) M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23) \
    M(24) M(25) M(26) M(27) M(28) M(29) M(30) M(31)
#if TNA_CELLS == 16
#define FOR_EACH_CELL(M) CELLS_0_15(M)
#elif TNA_CELLS == 32
#define FOR_EACH_CELL(M) CELLS_0_15(M) CELLS_16_31(M)
#else
#error "TNA_CELLS must be 16 or 32"
#endif

#endif
