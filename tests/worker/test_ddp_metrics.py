"""The worker's metrics endpoint (homagg/worker/ddp/metrics.py), scraped over HTTP and parsed
with prometheus_client's own parser: names, types and label sets, values equal to the hook's
stats, densities kept out of labels; one endpoint per port in a process, port + local rank,
a taken port a warning; where the request comes from (arguments, environment) and its
refusals."""

from __future__ import annotations

import socket
import threading
import urllib.request
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from homagg.environment import METRICS_ADDRESS_ENV, METRICS_PORT_ENV
from homagg.worker.ddp import metrics
from homagg.worker.ddp.fallback import KIND_TEXT, SWITCH_TIMEOUT
from homagg.worker.ddp.hook import SwitchHookState
from homagg.worker.ddp.metrics import MetricsRequest, expose, metrics_request
from homagg.worker.transport.switch_transport import TransportStats


def hook_state(job_id: int | None, rank: int = 0) -> SwitchHookState:
    """A hook state with numbers in every stat, and (job_id set) an agent and transport."""
    state = SwitchHookState(None, "auto", world_size=2, rank=rank)
    s = state.stats
    s.switch_buckets, s.host_buckets, s.fallback_buckets = 40, 7, 3
    s.fallbacks = 2
    s.fallback_reasons[KIND_TEXT[SWITCH_TIMEOUT]] += 2
    s.dense_bytes, s.wire_bytes, s.retransmissions, s.agreements = 4000, 1082 * 9, 4, 12
    s.agreement_seconds = 0.25
    s.timeouts, s.cwnd, s.cwnd_halvings = 3, 48, 2
    s.auto_choices.update({"lossless": 5, "cltk@0.0625": 3, "cltk@0.125": 2, "host": 7})
    s.leased_steps = 1
    state.steps = 6
    if job_id is not None:
        stats = TransportStats(encode_seconds=0.5, exchange_seconds=1.5, decode_seconds=0.125)
        state.agent = SimpleNamespace(  # type: ignore[assignment]
            config=SimpleNamespace(job_id=job_id),
            transport=SimpleNamespace(stats=stats),
            heartbeats=30,
            heartbeat_failures=1,
        )
    return state


def scrape(url: str) -> dict[str, object]:
    """The families of a scrape by name."""
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def values(family, **match: str) -> dict[tuple, float]:
    """A family's samples that match `match`, by their other labels' values."""
    out = {}
    for sample in family.samples:
        if all(sample.labels.get(k) == v for k, v in match.items()) and not sample.name.endswith(
            "_created"
        ):
            rest = tuple(v for k, v in sorted(sample.labels.items()) if k not in match)
            out[rest] = sample.value
    return out


@pytest.fixture(scope="module")
def served():
    """Every endpoint the module's tests start, closed together at its end (each close
    waits up to the server's 0.5 s poll)."""
    endpoints: list[metrics.WorkerMetrics] = []
    yield endpoints
    closers = [threading.Thread(target=m.close) for m in endpoints]
    for t in closers:
        t.start()
    for t in closers:
        t.join(5)
    metrics._endpoints.served.clear()


@pytest.fixture
def endpoint(served):
    def serve(state, request, rank=0):
        got = expose(state, request, rank)
        if got is not None and got not in served:
            served.append(got)
        return got

    return serve


def test_a_scrape_parses_with_names_types_labels_and_the_stats_values(endpoint):
    m = endpoint(hook_state(5), MetricsRequest("127.0.0.1", 0))
    assert m.url.startswith("http://127.0.0.1:") and m.port > 0
    fam = scrape(m.url)
    counters = {n for n, f in fam.items() if f.type == "counter"}
    assert {
        "homagg_worker_buckets",
        "homagg_worker_fallbacks",
        "homagg_worker_dense_bytes",
        "homagg_worker_wire_bytes",
        "homagg_worker_retransmissions",
        "homagg_worker_timeouts",
        "homagg_worker_cwnd_halvings",
        "homagg_worker_hook_seconds",
        "homagg_worker_auto_decisions",
        "homagg_worker_heartbeats",
    } <= counters  # exposed as NAME_total, the parser names the family without it
    assert fam["homagg_worker_info"].type == "gauge"
    assert fam["homagg_worker_cwnd"].type == "gauge"
    assert values(fam["homagg_worker_cwnd"], job="5") == {(): 48}
    assert values(fam["homagg_worker_cwnd_halvings"], job="5") == {(): 2}
    assert values(fam["homagg_worker_timeouts"], job="5") == {(): 3}
    assert values(fam["homagg_worker_info"], job="5") == {("auto", "0", "2"): 1.0}
    assert values(fam["homagg_worker_buckets"], job="5") == {
        ("switch",): 40,
        ("host",): 7,
        ("fallback",): 3,
    }
    assert values(fam["homagg_worker_fallbacks"], job="5")[("switch_failed",)] == 2
    assert sum(values(fam["homagg_worker_fallbacks"], job="5").values()) == 2
    assert values(fam["homagg_worker_hook_seconds"], job="5") == {
        ("encode",): 0.5,
        ("wait",): 1.5,
        ("decode",): 0.125,
        ("agreement",): 0.25,
    }
    assert values(fam["homagg_worker_auto_decisions"], job="5") == {
        ("cltk",): 5,  # 3 + 2: the density is no label
        ("host",): 7,
        ("lossless",): 5,
    }
    assert values(fam["homagg_worker_wire_bytes"], job="5") == {(): 1082 * 9}
    assert values(fam["homagg_worker_heartbeats"], job="5") == {("answered",): 30, ("failed",): 1}
    for f in fam.values():  # every label set is bounded: no chunk, slot or density labels
        for sample in f.samples:
            assert set(sample.labels) <= {"job", "path", "reason", "part", "method", "result"} | {
                "rank",
                "world_size",
                "codec",
            }


def test_one_endpoint_per_port_and_local_rank_adds_to_the_base_port(endpoint):
    base = _two_free_ports()
    request = MetricsRequest("127.0.0.1", base)
    first = endpoint(hook_state(5), request, rank=0)
    second = endpoint(hook_state(6, rank=1), request, rank=1)
    again = endpoint(hook_state(8), request, rank=0)  # a second attach in rank 0's process
    assert (first.port, second.port) == (base, base + 1) and again is first
    assert set(values(scrape(first.url)["homagg_worker_steps"])) == {("5",), ("8",)}
    assert set(values(scrape(second.url)["homagg_worker_steps"])) == {("6",)}


def test_a_taken_port_is_one_warning_and_no_metrics(endpoint):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.warns(RuntimeWarning, match=f"no worker metrics on 127.0.0.1:{port}"):
            assert endpoint(hook_state(5), MetricsRequest("127.0.0.1", port)) is None


def test_a_state_without_agent_is_labelled_none_and_counts_zero_time(endpoint):
    m = endpoint(hook_state(None), MetricsRequest("127.0.0.1", 0))
    fam = scrape(m.url)
    assert values(fam["homagg_worker_buckets"], job="none")[("fallback",)] == 3
    assert set(values(fam["homagg_worker_hook_seconds"], job="none").values()) == {0.0, 0.25}


def test_the_request_comes_from_the_arguments_then_the_environment():
    assert metrics_request(None, None, {}) is None
    assert metrics_request(9400, None, {}) == MetricsRequest("127.0.0.1", 9400)
    env = {METRICS_PORT_ENV: "9500", METRICS_ADDRESS_ENV: "0.0.0.0"}
    assert metrics_request(None, None, env) == MetricsRequest("0.0.0.0", 9500)
    assert metrics_request(9400, "::1", env) == MetricsRequest("::1", 9400)
    assert MetricsRequest("127.0.0.1", 9400).port_of(3) == 9403
    assert MetricsRequest("127.0.0.1", 0).port_of(3) == 0


@pytest.mark.parametrize(
    ("port", "address", "env", "message"),
    [
        (70000, None, {}, "metrics_port=70000: expected a TCP port"),
        (-1, None, {}, "metrics_port=-1"),
        (None, None, {METRICS_PORT_ENV: "94OO"}, "HOMAGG_METRICS_PORT='94OO'"),
        (9400, "metrics.example", {}, "metrics address 'metrics.example'"),
    ],
)
def test_bad_requests_are_errors_that_name_the_value(port, address, env, message):
    with pytest.raises(ValueError, match=message):
        metrics_request(port, address, env)


def _two_free_ports() -> int:
    """A port P with P + 1 free too (for two local ranks)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
        try:
            with socket.socket() as b, socket.socket() as c:
                b.bind(("127.0.0.1", port))
                c.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise AssertionError("no two consecutive free ports")
