"""The controller's gRPC modules, generated from p4rtproto/jobs.proto at build time."""

try:
    from p4rtproto import jobs_pb2, jobs_pb2_grpc
except ImportError as exc:  # pragma: no cover - only on a checkout that skipped the build
    raise ImportError("the controller's gRPC modules are not generated yet: run `make venv` "
                      "(or `python -m p4rtproto.generate`)") from exc

__all__ = ["jobs_pb2", "jobs_pb2_grpc"]
