/* Every size and code of the program, in one place. aggwire/constants.py mirrors the
 * values marked "wire" and tests/aggwire/test_constants.py checks that they agree. */
#ifndef HOMAGG_CONSTANTS_P4
#define HOMAGG_CONSTANTS_P4

/* int32 cells per aggregation packet (wire). A compile-time choice: 64, 128 or 256;
 * 256 gives BMv2 2.1x the cells per second of 64 (docs/performance.md). */
#ifndef CELLS_PER_PKT
#define CELLS_PER_PKT 256
#endif
/* A register entry holds 8 int32 lanes: BMv2 limits shifts, and so slice positions,
 * to 256 bits, and each register access is what costs on BMv2. */
#define LANES_PER_GROUP 8
#define CELL_GROUPS (CELLS_PER_PKT / LANES_PER_GROUP)

/* Aggregation slots of the whole switch; each has two copies (shadow sets), chosen by
 * the header's shadow, so a slot copy's index is slot * SHADOW_COPIES + shadow, i.e.
 * (slot << SHADOW_BITS) | shadow. */
#define NUM_SLOTS 4096
#define SHADOW_BITS 1
#define SHADOW_COPIES (1 << SHADOW_BITS)
#define NUM_SLOT_COPIES (SHADOW_COPIES * NUM_SLOTS)
#define MAX_JOBS 256
#define MAX_WORKERS 1024
#define IPV4_TABLE_SIZE 1024
#define ARP_TABLE_SIZE 1024

typedef bit<9>  port_t;
typedef bit<48> mac_addr_t;
typedef bit<32> ipv4_addr_t;
typedef bit<16> job_id_t;      /* wire: a job, 1..65535 (aggwire JOB_ID_BITS) */
typedef bit<32> chunk_t;       /* wire: a chunk number, a serial number (aggwire CHUNK_BITS) */
/* The top bit of a chunk_t difference a - b: set when chunk a is older than b (RFC 1982). */
#define CHUNK_OLDER_BIT 31:31
typedef bit<32> slot_index_t;  /* a slot or slot copy of the whole switch (register index) */

const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<16> ETHERTYPE_ARP  = 0x0806;
const bit<8>  IP_PROTO_UDP   = 17;
const bit<16> ARP_HTYPE_ETHERNET = 1;
const bit<16> ARP_OPER_REQUEST = 1;
const bit<16> ARP_OPER_REPLY   = 2;
const bit<8>  RESULT_TTL = 64;

/* Aggregation protocol (wire). */
const bit<16> AGG_UDP_PORT = 40700;
const bit<8>  AGG_VERSION  = 1;
const bit<8>  AGG_FLAG_RESULT = 0x01;
const bit<8>  AGG_FLAG_RETX   = 0x02;
const bit<8>  AGG_OP_ADD = 1;
const bit<8>  AGG_OP_OR  = 2;
const bit<8>  AGG_OP_MAX = 3;
const bit<8>  AGG_OP_ADD16 = 4;  /* 2 int16 lanes per cell, each wraps on its own */
const bit<8>  AGG_OP_ADD8  = 5;  /* 4 int8 lanes per cell, each wraps on its own */
/* Ops are AGG_OP_ADD..AGG_OP_LAST; any other is dropped with DROP_BAD_OP. */
#define AGG_OP_LAST AGG_OP_ADD8
/* The top bit of every 16- and 8-bit lane of a bit<256> cell group (lane adds, see
 * lanes_add_narrow in aggregation.p4). */
const bit<256> LANE16_TOP_BITS =
    0x8000800080008000800080008000800080008000800080008000800080008000;
const bit<256> LANE8_TOP_BITS =
    0x8080808080808080808080808080808080808080808080808080808080808080;
const bit<16> AGG_HEADER_BYTES = 16;
const bit<16> AGG_UDP_LENGTH = 8 + AGG_HEADER_BYTES + 4 * CELLS_PER_PKT;
const bit<16> AGG_IPV4_LENGTH = 20 + AGG_UDP_LENGTH;

/* Drop reasons (wire: index of the drop_counter cell). */
const bit<8> DROP_NONE             = 0;
const bit<8> DROP_TRUNCATED        = 1;
const bit<8> DROP_BAD_HEADER       = 2;
const bit<8> DROP_BAD_LENGTH       = 3;
const bit<8> DROP_BAD_OP           = 4;
const bit<8> DROP_UNKNOWN_JOB      = 5;
const bit<8> DROP_BAD_RANK         = 6;
const bit<8> DROP_WRONG_PORT       = 7;
const bit<8> DROP_SLOT_OUT_OF_POOL = 8;
const bit<8> DROP_DUPLICATE        = 9;
const bit<8> DROP_STALE            = 10;
const bit<8> DROP_NO_ROUTE         = 11;
const bit<8> DROP_TTL_EXPIRED      = 12;
const bit<8> DROP_UNSUPPORTED      = 13;
const bit<8> DROP_NO_RECIPIENT     = 14;
/* Never set by this program: the reference switch counts in this ingress cell the frames its
 * sockets dropped before its pipeline (aggwire.constants.DropReason.KERNEL_RX_OVERFLOW). */
const bit<8> DROP_KERNEL_RX_OVERFLOW = 15;
#define NUM_DROP_REASONS 16

/* Aggregation events (wire: index of the event_counter cell). */
const bit<32> EVENT_CONTRIBUTION = 0;
const bit<32> EVENT_RESULT       = 1;
const bit<32> EVENT_RESENT       = 2;
#define NUM_EVENTS 4

/* Verdicts of a contribution against its slot copy. */
const bit<8> VERDICT_FRESH     = 1;  /* first of a newer round (or another job): overwrite */
const bit<8> VERDICT_COMBINE   = 2;  /* same round, new worker: combine with op */
const bit<8> VERDICT_RESEND    = 3;  /* same round, worker seen, round complete: result back */
const bit<8> VERDICT_DUPLICATE = 4;  /* same round, worker seen, round open: drop */
const bit<8> VERDICT_STALE     = 5;  /* an older round of the same job: drop */

/* Per slot copy state, packed in one register entry so one access reads it all, highest
 * bits first: job id 16 | chunk 32 | seen bitmap 32 | count 8 | exponent 8. The slices
 * below name each field's bits (hi:lo); tests/p4src/test_source.py checks they tile the
 * entry and match the widths of job_id_t, chunk_t and the header's exp. */
#define SLOT_STATE_BITS 96
#define SLOT_STATE_JOB   95:80
#define SLOT_STATE_CHUNK 79:48
#define SLOT_STATE_SEEN  47:16
#define SLOT_STATE_COUNT 15:8
#define SLOT_STATE_EXP   7:0

/* Two-level aggregation (docs/protocol.md). */
const bit<32> EVENT_PARTIAL = 3;  /* a leaf's partial sum sent up (first send or re-send) */
/* Same round, worker seen, round complete at this leaf, the parent's result not in yet:
 * the partial goes up again. */
const bit<8> VERDICT_RESEND_UP = 6;
/* The count field's top bit: set at a leaf when the parent's result is stored in the copy
 * (the copy is final); the low bits count the contributions (at most 32). */
const bit<8> SLOT_FINAL      = 0x80;
const bit<8> SLOT_COUNT_MASK = 0x7f;
/* service_source (forwarding.p4): this switch's service address and those of the other
 * switches of its tree (at most a parent and 32 leaves). */
#define SERVICE_SOURCE_TABLE_SIZE 64

#ifndef HOMAGG_TNA
/* FOR_EACH_GROUP(M) expands M(i) for every 8-lane group of the cells. */
#define GROUPS_0_7(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)
#define GROUPS_8_15(M) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15)
#define GROUPS_16_31(M) M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23) \
    M(24) M(25) M(26) M(27) M(28) M(29) M(30) M(31)
#if CELLS_PER_PKT == 64
#define FOR_EACH_GROUP(M) GROUPS_0_7(M)
#elif CELLS_PER_PKT == 128
#define FOR_EACH_GROUP(M) GROUPS_0_7(M) GROUPS_8_15(M)
#elif CELLS_PER_PKT == 256
#define FOR_EACH_GROUP(M) GROUPS_0_7(M) GROUPS_8_15(M) GROUPS_16_31(M)
#else
#error "CELLS_PER_PKT must be 64, 128 or 256"
#endif

#endif  /* HOMAGG_TNA */

#endif
