"""The hook's stats as Prometheus metrics over HTTP, optionally (`homagg.attach(...,
metrics_port=P)` or $HOMAGG_METRICS_PORT): buckets per path, bytes, retransmissions,
fallbacks by kind, the time split (encode, wait, decode, agreement) and codec="auto"'s
decisions, read from the states' `HookStats` and their transports' stats at each scrape
(nothing is counted twice, nothing on the hook's path).

Local rank L serves on port P + L (as its UDP port is WORKER_UDP_BASE + L), on loopback
unless an address is given ($HOMAGG_METRICS_ADDRESS, `metrics_address=`); P = 0 takes any
free port (`state.metrics.url` says which). One endpoint per process and port: a second
attach in the process adds its state to the endpoint the first one started, labelled by
job id. prometheus_client's global registry is never used."""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from homagg.environment import METRICS_ADDRESS_ENV, METRICS_PORT_ENV
from homagg.metrics_endpoint import MetricsEndpoint
from homagg.worker.ddp.fallback import KIND_NAME, KIND_TEXT

if TYPE_CHECKING:
    from homagg.worker.ddp.hook import SwitchHookState

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "127.0.0.1"
PREFIX = "homagg_worker_"
PARTS = ("encode", "wait", "decode", "agreement")  # the time split's `part` label
PATHS = ("switch", "host", "fallback")  # the buckets' `path` label


@dataclass(frozen=True)
class MetricsRequest:
    """Where a rank's metrics are asked for: an address and a base port (0: any free)."""

    address: str
    port: int

    def port_of(self, local_rank: int) -> int:
        """The port local rank `local_rank` serves on (0 stays 0: any free port)."""
        return self.port + local_rank if self.port else 0


def metrics_request(
    port: int | None, address: str | None, environ: Mapping[str, str] = os.environ
) -> MetricsRequest | None:
    """attach's arguments, else the environment; None: no metrics. ValueError naming the
    value when the port is not 0..65535 or the address is not an IP address."""
    where = "metrics_port"
    if port is None and environ.get(METRICS_PORT_ENV, ""):
        where, text = METRICS_PORT_ENV, environ[METRICS_PORT_ENV]
        if not text.strip().isdigit():
            raise ValueError(f"{METRICS_PORT_ENV}={text!r}: expected a TCP port, 0..65535")
        port = int(text)
    if port is None:
        return None
    if not 0 <= port <= 65535:
        raise ValueError(f"{where}={port}: expected a TCP port, 0..65535 (0: any free port)")
    address = address or environ.get(METRICS_ADDRESS_ENV, "") or DEFAULT_ADDRESS
    try:
        ipaddress.ip_address(address)
    except ValueError:
        raise ValueError(
            f"metrics address {address!r} (metrics_address or {METRICS_ADDRESS_ENV}): "
            "expected an IP address, e.g. 127.0.0.1 (the default) or 0.0.0.0"
        ) from None
    return MetricsRequest(address, port)


def local_rank(environ: Mapping[str, str] = os.environ) -> int:
    """torchrun's LOCAL_RANK (0 when unset or not a number)."""
    text = environ.get("LOCAL_RANK", "0")
    return int(text) if text.isdigit() else 0


class HookCollector(Collector):
    """Every added hook state's stats, read at each scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: list[tuple[str, SwitchHookState, Any]] = []

    def add(self, state: SwitchHookState) -> None:
        """Report `state` (and its agent's transport: kept, as the session drops it at the
        end of the job) from the next scrape on, labelled by its job id."""
        agent = state.agent
        job = str(agent.config.job_id) if agent is not None else "none"
        with self._lock:
            self._states.append((job, state, agent))

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            states = list(self._states)
        families = _families()
        for job, state, agent in states:
            _count(families, job, state, agent)
        yield from families.values()


def _families() -> dict[str, Any]:
    """The metric families, empty, by short name."""

    def counter(name: str, doc: str, *labels: str) -> CounterMetricFamily:
        return CounterMetricFamily(PREFIX + name, doc, labels=["job", *labels])

    return {
        "info": GaugeMetricFamily(
            PREFIX + "info", "1 per hook state", labels=["job", "rank", "world_size", "codec"]
        ),
        "on_switch": GaugeMetricFamily(
            PREFIX + "on_switch",
            "1 while the ranks agreed on the switch path, 0 on the fallback",
            labels=["job"],
        ),
        "steps": counter("steps", "training steps the hook saw end"),
        "buckets": counter("buckets", "gradient buckets by the path they took", "path"),
        "fallbacks": counter("fallbacks", "switch-to-fallback transitions by cause", "reason"),
        "dense": counter("dense_bytes", "float32 bytes of the buckets summed by the switch"),
        "wire": counter("wire_bytes", "aggregation frames' bytes sent, resends included"),
        "retx": counter("retransmissions", "aggregation frames sent again"),
        "timeouts": counter("timeouts", "frames sent again on a retransmission timer's expiry"),
        "halvings": counter("cwnd_halvings", "retransmission timeouts that halved the window"),
        "cwnd": GaugeMetricFamily(
            PREFIX + "cwnd",
            "the transport's congestion window (chunks in flight allowed, at most the pool)",
            labels=["job"],
        ),
        "agreements": counter("agreements", "agreements of the ranks on the path"),
        "seconds": counter("hook_seconds", "time in the codec and the switch, by part", "part"),
        "heartbeats": counter("heartbeats", "heartbeats to the controller", "result"),
        "auto": counter("auto_decisions", 'codec="auto": bucket-steps per method', "method"),
        "leased": counter("auto_leased_steps", 'codec="auto": steps without an agreement'),
    }


def _count(families: dict[str, Any], job: str, state: SwitchHookState, agent: Any) -> None:
    """Add one state's numbers to `families`."""
    s = state.stats
    families["info"].add_metric([job, str(state.rank), str(state.world_size), state.codec_name], 1)
    families["on_switch"].add_metric([job], 1.0 if state.fallback.use else 0.0)
    families["steps"].add_metric([job], state.steps)
    for path, n in zip(PATHS, (s.switch_buckets, s.host_buckets, s.fallback_buckets)):
        families["buckets"].add_metric([job, path], n)
    reasons = dict.fromkeys(KIND_NAME.values(), 0)
    by_text = {text: KIND_NAME[kind] for kind, text in KIND_TEXT.items()}
    for text, n in list(s.fallback_reasons.items()):
        key = by_text.get(text, "unknown")
        reasons[key] = reasons.get(key, 0) + n
    for reason, n in reasons.items():
        families["fallbacks"].add_metric([job, reason], n)
    families["dense"].add_metric([job], s.dense_bytes)
    families["wire"].add_metric([job], s.wire_bytes)
    families["retx"].add_metric([job], s.retransmissions)
    families["timeouts"].add_metric([job], s.timeouts)
    families["halvings"].add_metric([job], s.cwnd_halvings)
    families["cwnd"].add_metric([job], s.cwnd)
    families["agreements"].add_metric([job], s.agreements)
    transport = agent.transport if agent is not None else None
    t = transport.stats if transport is not None else None
    split = (t.encode_seconds, t.exchange_seconds, t.decode_seconds) if t else (0.0, 0.0, 0.0)
    for part, seconds in zip(PARTS, (*split, s.agreement_seconds)):
        families["seconds"].add_metric([job, part], seconds)
    ok, failed = (agent.heartbeats, agent.heartbeat_failures) if agent is not None else (0, 0)
    families["heartbeats"].add_metric([job, "answered"], ok)
    families["heartbeats"].add_metric([job, "failed"], failed)
    methods: dict[str, int] = {}
    for label, n in list(s.auto_choices.items()):
        method = label.split("@")[0]  # "cltk@0.0625": the density would make labels explode
        methods[method] = methods.get(method, 0) + n
    for method, n in sorted(methods.items()):
        families["auto"].add_metric([job, method], n)
    families["leased"].add_metric([job], s.leased_steps)


class WorkerMetrics:
    """One metrics endpoint: a registry of its own holding a HookCollector, served by the
    process's metrics endpoint (homagg.metrics_endpoint) until close()."""

    def __init__(self, address: str, port: int) -> None:
        self.collector = HookCollector()
        self.registry = CollectorRegistry()
        self.registry.register(self.collector)
        # the address comes from an explicit request (attach's or the environment's), so a
        # non-loopback one is allowed here (and warned about by the endpoint)
        self._endpoint = MetricsEndpoint(
            self.registry,
            f"[{address}]:{port}" if ":" in address else f"{address}:{port}",
            allow_non_loopback=True,
        )
        self.address, self.port = address, self._endpoint.port

    @property
    def url(self) -> str:
        """Where a scraper reads the metrics."""
        return self._endpoint.url

    def close(self) -> None:
        """Stop serving and free the port."""
        self._endpoint.close()


class _Endpoints:
    """The process's endpoints by (address, port asked for): one port serves every state
    of the process that asks for it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.served: dict[tuple[str, int], WorkerMetrics] = {}


_endpoints = _Endpoints()


def expose(state: SwitchHookState, request: MetricsRequest, rank: int) -> WorkerMetrics | None:
    """Serve `state`'s stats at `request` for local rank `rank` (the process's endpoint for
    that port when there is one); None, with one RuntimeWarning, when the port cannot be
    had: training goes on without metrics."""
    port = request.port_of(rank)
    if port > 65535:
        warnings.warn(
            f"homagg: rank {state.rank}: no worker metrics: port {port} is base port "
            f"{request.port} + local rank {rank}, above 65535",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    with _endpoints.lock:
        metrics = _endpoints.served.get((request.address, port)) if port else None
        if metrics is None:
            try:
                metrics = WorkerMetrics(request.address, port)
            except OSError as exc:
                warnings.warn(
                    f"homagg: rank {state.rank}: no worker metrics on {request.address}:{port} "
                    f"(base port {request.port} + local rank {rank}): {exc}",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return None
            if port:
                _endpoints.served[(request.address, port)] = metrics
    metrics.collector.add(state)
    log.info("rank %d: worker metrics at %s", state.rank, metrics.url)
    return metrics
