"""P4Runtime protobuf and gRPC modules, generated at build time (see generate.py).

Import from here rather than from the `p4runtime` wheel, whose own modules do not load
with a current protobuf runtime.
"""

try:
    from homagg.p4rt.gen.p4.config.v1 import p4info_pb2
    from homagg.p4rt.gen.p4.v1 import p4data_pb2, p4runtime_pb2, p4runtime_pb2_grpc
except ImportError as exc:  # pragma: no cover - only on a checkout that skipped the build
    raise ImportError(
        "P4Runtime modules are not generated yet: run `make venv` "
        "(or `python -m homagg.p4rt.generate`)"
    ) from exc

__all__ = ["GRPC_OPTIONS", "p4data_pb2", "p4info_pb2", "p4runtime_pb2", "p4runtime_pb2_grpc"]

# Pipelines are large (the 256-cell BMv2 JSON is ~10 MB): gRPC's 4 MB default is too small.
# PI's server accepts such messages too.
# A failing Write's per-update errors come in a trailer: 300 failures make ~35 KB, over gRPC's
# 16 KiB default metadata limit (the call would end "Stream removed"); the reference switch
# keeps its trailers below 8 KiB (homagg/refswitch/p4runtime_write.py), PI's server never bounds
# them:
# the controller's Writes of at most 100 updates (homagg/control/switch_connection.py) make up to
# ~27 KB with PI's messages (tests/control/test_switch_connection.py).
GRPC_OPTIONS = (
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_metadata_size", 1 << 20),
)
