"""The environment variables homagg reads or sets, each named here once; docs/environment.md
is their table (tests/test_environment.py checks that the two agree). It imports nothing:
the controller, the CLIs and homagg-run import it without torch."""

# What a job's ranks read (homagg.attach and the homagg backend: homagg/worker/job/setup.py);
# homagg-run (homagg/worker/job/launch.py) sets the first three for the ranks it starts.
CONTROLLER_ENV = "HOMAGG_CONTROLLER"  # the controller's host:port (ranks; homagg-run's default)
JOB_ID_ENV = "HOMAGG_JOB_ID"  # a job made outside the script (its token: JOB_TOKEN_FILE_ENV)
CODEC_ENV = "HOMAGG_CODEC"  # the codec the ranks ask for (homagg-run: --codec's default)
IFACE_ENV = "HOMAGG_IFACE"  # ranks: the data-plane interface, when not the route to the controller
READY_TIMEOUT_ENV = "HOMAGG_READY_TIMEOUT"  # ranks: s, the wait for every rank (join, WaitReady)
METRICS_PORT_ENV = (
    "HOMAGG_METRICS_PORT"  # ranks: serve the hook's metrics on this port + LOCAL_RANK
)
METRICS_ADDRESS_ENV = "HOMAGG_METRICS_ADDRESS"  # ranks: ... on this address (default loopback)
ATTACH_ENV = "HOMAGG_ATTACH"  # ranks: "0": homagg.attach stays off (the script's own collectives)

# Secrets and TLS of the job API's clients (homagg/api/credentials.py, homagg/api/tls.py):
# aggctl, python -m homagg.worker, homagg-run and the ranks.
OPERATOR_TOKEN_ENV = "HOMAGG_OPERATOR_TOKEN"  # an operator credential (aggctl, rank 0, homagg-run)
OPERATOR_TOKEN_FILE_ENV = "HOMAGG_OPERATOR_TOKEN_FILE"  # a file holding one (the same readers)
JOB_TOKEN_ENV = "HOMAGG_TOKEN"  # a worker's job token (ranks, python -m homagg.worker)
JOB_TOKEN_FILE_ENV = "HOMAGG_TOKEN_FILE"  # a file holding one (the same; homagg-run sets it)
CA_FILE_ENV = "HOMAGG_CA_FILE"  # the CA that signed the controller's certificate (every client)
INSECURE_ENV = "HOMAGG_INSECURE"  # "1": plaintext to a controller without TLS (tests, local use)

# The lab's switches, make run and the benchmarks.
BMV2_OPT_ENV = "HOMAGG_BMV2_OPT"  # the optimized BMv2 build's prefix (homagg/lab/switch_process.py)
EBPF_XDP_ENV = "HOMAGG_EBPF_XDP"  # the eBPF switch's XDP stage: native, generic or off
CELLS_PER_PKT_ENV = "HOMAGG_CELLS_PER_PKT"  # cells a packet (homagg/wire/constants.py; 256)
LOG_ENV = "HOMAGG_LOG"  # the log level of make run's ranks (run/train.py; WARNING)

# The worker's transport (homagg/worker/transport/io_path.py): every process that aggregates.
TRANSPORT_IO_ENV = "HOMAGG_TRANSPORT_IO"  # "batched" or "python": the transport's I/O path
CONGESTION_WINDOW_ENV = "HOMAGG_CONGESTION_WINDOW"  # "1" / "0": the transport's window on or off
