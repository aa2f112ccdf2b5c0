"""The controller's Prometheus metrics (docs/controller.md, "Metrics"): its own state read at
scrape time (jobs, slots, switch sessions, lease expiries), the RPCs it answers
(rpc_metrics.py), and the switches' P4Runtime counters, read by a thread every
`metrics_interval` seconds and cached, so that a scrape never reads a switch.

Labels never explode: switches are configured, ports are the switches' ports, jobs are
labelled by job id only (never a name, a token or a worker's address) and only while they
run: an ended job's series disappear at the next scrape."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from homagg.control.counters import SwitchCounters
from homagg.control.jobs import JobManager
from homagg.control.port_buffer import port_buffers
from homagg.control.rpc_metrics import RpcMetrics
from homagg.control.views import job_counters
from homagg.metrics_endpoint import MetricsEndpoint
from homagg.wire.constants import Event

log = logging.getLogger(__name__)
# The event_counter's cells, each a metric of its own: homagg_switch_<name>_total.
EVENT_METRICS = {
    Event.CONTRIBUTION: ("contributions", "Contributions the switch added into a slot"),
    Event.RESULT: ("results", "Results the switch sent (a slot completed)"),
    Event.RESENT: ("resends", "Results the switch sent again for a retransmitted chunk"),
    Event.PARTIAL: ("partials", "Partial sums a leaf sent up to its parent (sends and re-sends)"),
}
RankKey = tuple[str, int, int]  # switch, job id, rank
Family = GaugeMetricFamily | CounterMetricFamily
SYNC_RETRY = 0.5  # seconds between reads while a switch is still syncing after the start


@dataclass
class SwitchRead:
    """The newest counters of one switch, when they were read and how many reads failed."""

    counters: SwitchCounters | None = None
    at: float = 0.0
    errors: int = 0


@dataclass
class CounterCache:
    """The switches' counters as last read, and per port the packets of every rank (worker
    table counters summed by the rank's switch port), kept monotonic across ended jobs and
    switch restarts: a rank's last count moves into `port_base` when its entry goes away or
    its counter starts again."""

    reads: dict[str, SwitchRead] = field(default_factory=dict)
    last: dict[RankKey, tuple[int, int]] = field(default_factory=dict)  # port, packets
    port_base: dict[tuple[str, int], int] = field(default_factory=dict)

    def update(self, read: SwitchCounters, ports: dict[RankKey, int], now: float) -> None:
        """Take one switch's new read; `ports` gives each live rank's switch port."""
        entry = self.reads.setdefault(read.switch, SwitchRead())
        if read.error:
            entry.errors += 1
            return
        entry.counters, entry.at = read, now
        seen: dict[RankKey, tuple[int, int]] = {}
        for job in read.jobs:
            for w in job.workers:
                key = (read.switch, job.job_id, w.rank)
                port = ports.get(key)
                if port is not None:
                    seen[key] = (port, w.packets)
        for key, (port, packets) in list(self.last.items()):
            if key[0] != read.switch:
                continue
            now_seen = seen.get(key)
            if now_seen is None or now_seen[1] < packets:  # gone, or counting again from 0
                base_key = (read.switch, port)
                self.port_base[base_key] = self.port_base.get(base_key, 0) + packets
                if now_seen is None:
                    del self.last[key]
        self.last.update(seen)

    def port_packets(self) -> dict[tuple[str, int], int]:
        """Packets per (switch, port) since the controller started."""
        total = dict(self.port_base)
        for (switch, _, _), (port, packets) in self.last.items():
            total[(switch, port)] = total.get((switch, port), 0) + packets
        return total


class CounterPoller:
    """Reads every switch's counters every `interval` seconds into a CounterCache."""

    def __init__(self, manager: JobManager, interval: float) -> None:
        self.m, self.interval = manager, interval
        self.cache = CounterCache()
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-counters", daemon=True)

    def start(self) -> None:
        """Read now, then every interval."""
        self._thread.start()

    def stop(self) -> None:
        """Stop reading (a read in flight ends within the switch's timeout)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(max(s.config.timeout for s in self.m.switches.values()) + 1)

    def poll(self) -> bool:
        """One read of every switch (outside the manager's lock, as `aggctl counters`); a
        switch not read back yet since the controller started (still syncing) is skipped:
        False when one was."""
        with self.m.lock:
            syncing = set(self.m.unread)
            ports = {
                (w.switch or j.switch, j.job_id, w.rank): w.switch_port
                for j in self.m.jobs.values()
                if j.switch is not None
                for w in j.workers.values()
            }
        found = job_counters(self.m)
        now = time.monotonic()
        with self.lock:
            for read in found:
                if read.switch not in syncing:
                    self.cache.update(read, ports, now)
        return not syncing

    def _run(self) -> None:
        while not self._stop.is_set():
            done = True
            try:
                done = self.poll()
            except Exception:  # the metrics must never stop the controller
                log.exception("reading the switches' counters for the metrics failed")
            # a switch still syncing after the start is read as soon as it is synced
            self._stop.wait(self.interval if done else min(self.interval, SYNC_RETRY))


class ControllerCollector(Collector):
    """The families a scrape gets, built from the manager's state and the cached counters."""

    def __init__(self, manager: JobManager, poller: CounterPoller) -> None:
        self.m, self.poller = manager, poller

    def collect(self) -> Iterator[Family]:
        families, live = self._state()
        yield from families
        yield from self._ports()
        yield from self._counters(live)

    def _ports(self) -> Iterator[Family]:
        """Each port in use: its slots in flight across jobs and the headroom its buffer has
        left (homagg/control/port_buffer.py), so an operator sees a port filling up."""
        used = GaugeMetricFamily(
            "homagg_controller_port_slots_in_flight",
            "Slots in flight on a switch port across the jobs with a rank there",
            labels=["switch", "port"],
        )
        headroom = GaugeMetricFamily(
            "homagg_controller_port_headroom_slots",
            "Slots a further rank's pool may still take on the port (its port_buffer less "
            "the slots in flight)",
            labels=["switch", "port"],
        )
        with self.m.lock:
            for name, sw in self.m.switches.items():
                buffer = sw.config.port_buffer
                for port in port_buffers(self.m.jobs.values(), name, buffer, self.m.configs):
                    used.add_metric([name, str(port.port)], port.used)
                    headroom.add_metric([name, str(port.port)], port.headroom)
        yield from (used, headroom)

    def _state(self) -> tuple[list[Family], set[tuple[str, int]]]:
        """The controller's own state, and the live (switch, job id) pairs."""
        jobs = GaugeMetricFamily("homagg_controller_jobs", "Jobs running (not ended)")
        per_switch: dict[str, Family] = {
            "connected": GaugeMetricFamily(
                "homagg_controller_switch_connected",
                "1 while the controller is primary on the switch and has reconciled it",
                labels=["switch"],
            ),
            "jobs": GaugeMetricFamily(
                "homagg_controller_switch_jobs", "Jobs placed on the switch", labels=["switch"]
            ),
            "slots": GaugeMetricFamily(
                "homagg_controller_switch_slots",
                "Aggregation slots of the switch",
                labels=["switch"],
            ),
            "used": GaugeMetricFamily(
                "homagg_controller_switch_slots_used", "Slots held by job pools", labels=["switch"]
            ),
            "connects": CounterMetricFamily(
                "homagg_controller_switch_connects",
                "P4Runtime sessions opened to the switch (the first and every reconnection)",
                labels=["switch"],
            ),
            "reconciliations": CounterMetricFamily(
                "homagg_controller_switch_reconciliations",
                "Read-backs that made the switch hold what it should (after each connection, "
                "a regained primary or a failed removal)",
                labels=["switch"],
            ),
        }
        pools = GaugeMetricFamily(
            "homagg_controller_job_pool_slots",
            "Slots of a running job's pool",
            labels=["switch", "job"],
        )
        with self.m.lock:
            jobs.add_metric([], len(self.m.jobs))
            expiries = self.m.lease_expiries
            live = {(name, j.job_id) for j in self.m.jobs.values() for name in j.switches}
            for j in self.m.jobs.values():
                for name in j.pools:
                    pools.add_metric([name, str(j.job_id)], j.pool_size)
            for name, sw in self.m.switches.items():
                values = {
                    "connected": int(sw.connected),
                    "jobs": sum(1 for j in self.m.jobs.values() if name in j.switches),
                    "slots": sw.pools.total,
                    "used": sw.pools.total - sw.pools.slots_free(),
                    "connects": sw.connects,
                    "reconciliations": sw.reconciliations,
                }
                for key, family in per_switch.items():
                    family.add_metric([name], values[key])
        lease = CounterMetricFamily(
            "homagg_controller_lease_expiries", "Jobs ended because their leases ran out"
        )
        lease.add_metric([], expiries)
        return [jobs, *per_switch.values(), pools, lease], live

    def _counters(self, live: set[tuple[str, int]]) -> Iterator[Family]:
        """The switches' counters as last read; jobs only while they run."""
        fam = _counter_families()
        now = time.monotonic()
        with self.poller.lock:
            cache = self.poller.cache
            for switch, read in cache.reads.items():
                fam["errors"].add_metric([switch], read.errors)
                if read.counters is None:
                    continue
                fam["age"].add_metric([switch], now - read.at)
                _add_switch(fam, read.counters, live)
            for (switch, port), packets in sorted(cache.port_packets().items()):
                fam["port"].add_metric([switch, str(port)], packets)
        yield from fam.values()


def _counter_families() -> dict[str, Family]:
    fam: dict[str, Family] = {
        "age": GaugeMetricFamily(
            "homagg_controller_counters_age_seconds",
            "Seconds since the switch's counters were last read (metrics_interval)",
            labels=["switch"],
        ),
        "errors": CounterMetricFamily(
            "homagg_controller_counter_read_errors",
            "Reads of the switch's counters that failed (unreachable, not primary)",
            labels=["switch"],
        ),
        "drops": CounterMetricFamily(
            "homagg_switch_drops",
            "Packets the switch dropped, by pipeline stage and reason (P4 drop counters)",
            labels=["switch", "stage", "reason"],
        ),
    }
    for name, help_text in EVENT_METRICS.values():
        fam[name] = CounterMetricFamily(f"homagg_switch_{name}", help_text, labels=["switch"])
    fam["job_packets"] = CounterMetricFamily(
        "homagg_job_packets",
        "Packets of a running job (its job_table entry)",
        labels=["switch", "job"],
    )
    fam["job_bytes"] = CounterMetricFamily(
        "homagg_job_bytes", "Bytes of a running job's packets", labels=["switch", "job"]
    )
    fam["rank_packets"] = CounterMetricFamily(
        "homagg_job_rank_packets",
        "Packets of one rank of a running job (its worker_table entry)",
        labels=["switch", "job", "rank"],
    )
    fam["port"] = CounterMetricFamily(
        "homagg_switch_port_packets",
        "Aggregation packets the switch took in on a port from the ranks attached there, "
        "since the controller started",
        labels=["switch", "port"],
    )
    return fam


def _add_switch(
    fam: dict[str, Family],
    c: SwitchCounters,
    live: set[tuple[str, int]],
) -> None:
    for stage, values in (("ingress", c.ingress_drops), ("egress", c.egress_drops)):
        for v in values:
            fam["drops"].add_metric([c.switch, stage, v.name], v.packets)
    for v in c.events:
        if v.index in EVENT_METRICS:
            fam[EVENT_METRICS[Event(v.index)][0]].add_metric([c.switch], v.packets)
    for job in c.jobs:
        if (c.switch, job.job_id) not in live:
            continue  # ended since the read: its series go now
        labels = [c.switch, str(job.job_id)]
        fam["job_packets"].add_metric(labels, job.packets)
        fam["job_bytes"].add_metric(labels, job.bytes)
        for w in job.workers:
            fam["rank_packets"].add_metric([*labels, str(w.rank)], w.packets)


class ControllerMetrics:
    """The controller's registry (its own, never prometheus_client's global one), the RPC
    interceptor to give its gRPC server, the counter poller and the HTTP endpoint."""

    def __init__(self, manager: JobManager) -> None:
        cfg = manager.config
        self.registry = CollectorRegistry(auto_describe=True)
        self.rpcs = RpcMetrics(self.registry)
        self.poller = CounterPoller(manager, cfg.metrics_interval)
        self.registry.register(ControllerCollector(manager, self.poller))
        self.endpoint: MetricsEndpoint | None = None

    def start(self, address: str, allow_non_loopback: bool = False) -> str:
        """Serve on address (HOST:PORT) and start reading the counters; returns the URL."""
        self.endpoint = MetricsEndpoint(self.registry, address, allow_non_loopback)
        self.poller.start()
        url = self.endpoint.url
        log.info("metrics on %s (switch counters read every %g s)", url, self.poller.interval)
        return self.endpoint.url

    def stop(self) -> None:
        """Stop serving and reading."""
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None
        self.poller.stop()
