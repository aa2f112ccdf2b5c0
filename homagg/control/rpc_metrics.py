"""Counts and latencies of the controller's RPCs by method and status code: a gRPC server
interceptor feeding two prometheus_client metrics of the controller's own registry. Only the
methods the server implements get series (an unknown method name never becomes a label)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram

# WaitReady may wait up to 300 s; the other calls answer in milliseconds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60, 300)


class RpcMetrics(grpc.ServerInterceptor):
    """Counts every unary call the server answers (homagg_controller_rpcs_total{method,code})
    and times it (homagg_controller_rpc_duration_seconds{method})."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(
            "homagg_controller_rpcs",
            "RPCs the controller answered, by method and gRPC status code",
            ["method", "code"],
            registry=registry,
        )
        self.latency = Histogram(
            "homagg_controller_rpc_duration_seconds",
            "Time the controller took to answer an RPC, by method",
            ["method"],
            registry=registry,
            buckets=LATENCY_BUCKETS,
        )

    def intercept_service(
        self, continuation: Callable[[Any], Any], handler_call_details: Any
    ) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler  # not ours (gRPC answers UNIMPLEMENTED): no label from its name
        method = handler_call_details.method.rpartition("/")[2]
        inner = handler.unary_unary

        def timed(request: Any, context: grpc.ServicerContext) -> Any:
            start = time.perf_counter()
            code = grpc.StatusCode.UNKNOWN
            try:
                answer = inner(request, context)
                code = context.code() or grpc.StatusCode.OK
                return answer
            except Exception:
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            finally:
                self.calls.labels(method, code.name).inc()
                self.latency.labels(method).observe(time.perf_counter() - start)

        return grpc.unary_unary_rpc_method_handler(
            timed,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
