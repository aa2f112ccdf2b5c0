"""P4Runtime protobuf and gRPC modules, generated at build time (see generate.py).

Import from here rather than from the `p4runtime` wheel, whose own modules do not load
with a current protobuf runtime.
"""

try:
    from p4rtproto.gen.p4.config.v1 import p4info_pb2
    from p4rtproto.gen.p4.v1 import p4data_pb2, p4runtime_pb2, p4runtime_pb2_grpc
except ImportError as exc:  # pragma: no cover - only on a checkout that skipped the build
    raise ImportError("P4Runtime modules are not generated yet: run `make venv` "
                      "(or `python -m p4rtproto.generate`)") from exc

__all__ = ["p4info_pb2", "p4data_pb2", "p4runtime_pb2", "p4runtime_pb2_grpc"]
