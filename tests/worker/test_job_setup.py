"""The collective set-up (homagg/worker/job/setup.py, homagg/worker/job/setup_round.py) with ranks
as threads
over one in-memory store: every rank ends with the same outcome whatever its environment
(the controller on some ranks only, codecs that differ, a rank that never comes), within
the bounded wait; and rank 0's decision on the joins and the job's codec."""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any

import pytest
import torch.distributed as dist

from homagg.environment import CA_FILE_ENV, INSECURE_ENV, OPERATOR_TOKEN_ENV, READY_TIMEOUT_ENV
from homagg.lab.controlled import OPERATOR_TOKEN, Controlled
from homagg.wire.constants import MAX_RANKS
from homagg.worker.codecs import AUTO_CODEC
from homagg.worker.job import setup as job_setup
from homagg.worker.job.setup import Members, Request, _decide_codec, set_up
from homagg.worker.job.setup_round import SetupRound

pytestmark = pytest.mark.filterwarnings("ignore:homagg. rank:RuntimeWarning")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("HOMAGG_CONTROLLER", "HOMAGG_CODEC", "HOMAGG_JOB_ID", "HOMAGG_IFACE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(READY_TIMEOUT_ENV, "1")


def ranks(requests: list[Request | None], store: dist.Store | None = None) -> list[Any]:
    """set_up on one thread per request (None: that rank never comes); each rank's Setup
    or the exception it raised."""
    store = store or dist.HashStore()
    out: list[Any] = [None] * len(requests)

    def one(r: int, req: Request) -> None:
        try:
            out[r] = set_up(req, Members(store, r, len(requests)))
        except Exception as exc:
            out[r] = exc

    threads = [threading.Thread(target=one, args=(r, req)) for r, req in enumerate(requests) if req]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return out


def req(**kw: Any) -> Request:
    return Request(also=(AUTO_CODEC,), **kw)


def test_no_controller_anywhere_is_one_reason_on_every_rank():
    a, b = ranks([req(), req()])
    assert a.reason == b.reason and "no controller" in a.reason and a.complete


def test_a_controller_on_some_ranks_only_sends_every_rank_to_gloo():
    a, b, c = ranks([req(controller="127.0.0.1:1"), req(), req(controller="127.0.0.1:1")])
    assert a.agent is None and b.agent is None and c.agent is None
    assert a.reason == b.reason == c.reason
    assert "is set on rank(s) [0, 2] but not on rank(s) [1]" in a.reason


def test_codecs_that_differ_stop_every_rank():
    a, b = ranks([req(codec="lossless"), req(codec="fixed_point")])
    for err in (a, b):
        assert isinstance(err, ValueError)
        assert "rank 0 'lossless' (codec=), rank 1 'fixed_point' (codec=)" in str(err)
    a, b = ranks([req(), req(codec="lowbit3")])
    said = "codec= on rank 1: unknown codec 'lowbit3'"
    assert all(isinstance(e, ValueError) and said in str(e) for e in (a, b))


def test_a_world_above_the_data_plane_limit_is_every_ranks_reason(monkeypatch):
    """Ranks above the limit (the header's 8-bit rank: 256; 33..256 the controller decides by
    its topology): one reason on every rank, decided before any job is made (the
    controller's address leads nowhere and is never asked; plaintext is chosen, so the
    missing CA is not the reason). 33 threads stand for 257 with the limit at 32."""
    views = {r: {"controller": "127.0.0.1:1", "problem": ""} for r in range(MAX_RANKS + 1)}
    assert job_setup._environment_problem(views, MAX_RANKS) == ""
    limit = f"above the {MAX_RANKS} ranks a job can have (32 on one switch, up to 256 on a tree"
    assert limit in job_setup._environment_problem(views, MAX_RANKS + 1)
    monkeypatch.setenv(INSECURE_ENV, "1")
    monkeypatch.setattr(job_setup, "MAX_RANKS", 32)
    world = 33
    got = ranks([req(controller="127.0.0.1:1")] * world)
    assert all(s.agent is None and s.complete for s in got)
    assert {s.reason for s in got} == {
        f"world size {world} is above the 32 ranks a job can have (32 on one switch, up to "
        "256 on a tree of switches)"
    }


def test_a_refused_operator_credential_is_one_warning_per_rank(monkeypatch, tmp_path):
    """Rank 0 creates the job with an operator credential the controller refuses (a wrong
    one, or none): every rank warns once with rank 0's CreateJob error, which names no
    credential, and no job is made."""
    c = Controlled(tmp_path, 2, fabric=False, tls=True)
    try:
        monkeypatch.setenv(CA_FILE_ENV, str(c.ca_file))
        monkeypatch.setenv("HOMAGG_IFACE", "lo")
        for token in ("-not-the-operator-token", None):
            if token is None:
                monkeypatch.delenv(OPERATOR_TOKEN_ENV, raising=False)
            else:
                monkeypatch.setenv(OPERATOR_TOKEN_ENV, token)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = ranks([req(controller=c.address)] * 2)
            said = [str(w.message) for w in caught if "falls back" in str(w.message)]
            assert sorted(said) == sorted(
                f"homagg: rank {r} falls back to the process group's all_reduce: {got[r].reason}"
                for r in range(2)
            )
            assert got[0].reason == got[1].reason and got[0].agent is None, got[0].reason
            assert f"CreateJob failed at controller {c.address}: UNAUTHENTICATED" in got[0].reason
            assert OPERATOR_TOKEN not in got[0].reason and "not-the" not in got[0].reason
        assert c.client.list_jobs(include_ended=True).jobs == []
    finally:
        c.close()


def test_a_rank_that_never_comes_costs_one_bounded_wait():
    store = dist.HashStore()
    start = time.monotonic()
    a, _ = ranks([req(), None], store)
    assert time.monotonic() - start < 5
    assert "rank(s) [1] did not start the homagg set-up within 1 s" in a.reason
    assert not a.complete  # nothing may change the collectives: rank 1 is not in them
    _, late = ranks([None, req()], store)  # it comes after all: it reads the same answer
    assert late.reason == a.reason and not late.complete


def test_rounds_are_numbered_per_rank():
    store = dist.HashStore()
    first = [SetupRound(store, r, 2, "t") for r in range(2)]
    second = [SetupRound(store, r, 2, "t") for r in range(2)]
    assert [x.number for x in first] == [1, 1] and [x.number for x in second] == [2, 2]
    got: dict[int, Any] = {}
    t = threading.Thread(target=lambda: got.update({1: second[1].exchange("s", 1, 5, 5, sum)}))
    t.start()
    got[0] = second[0].exchange("s", 10, 5, 5, lambda v: sum(v.values()))
    t.join(10)
    assert got == {0: 11, 1: 11}
    second[0].forget("s")
    assert not store.check(["t/2/s/answer"])


def outcome(reason: str = "", codec: str = "fixed_point", lane_ops: bool = True) -> dict[str, Any]:
    return {"reason": reason, "codec": codec, "switch": "s1", "lane_ops": lane_ops}


def test_the_jobs_codec_decides_and_a_contradiction_is_an_error():
    two = {0: outcome(), 1: outcome()}
    assert _decide_codec(two, ["", ""], req(), 2, 7) == {"codec": "fixed_point", "lane_ops": True}
    err = _decide_codec(two, ["lossless", "HOMAGG_CODEC"], req(), 2, 7)["error"]
    assert "job 7 runs codec 'fixed_point'" in err and "HOMAGG_CODEC asks for 'lossless'" in err
    dense = {0: outcome(codec="dense"), 1: outcome(codec="dense")}
    assert (
        "made with codec 'dense', not one this worker runs"
        in (_decide_codec(dense, ["", ""], req(), 2, 7)["error"])
    )
    backend = Request(refusal_note=" (auto: the hook only)")
    auto = {0: outcome(codec="auto"), 1: outcome(codec="auto")}
    assert "(auto: the hook only)" in _decide_codec(auto, ["", ""], backend, 2, 7)["error"]


def test_a_failed_join_is_every_ranks_reason_and_a_silent_rank_is_incomplete():
    failed = {0: outcome("WaitReady failed"), 1: outcome("JoinJob failed")}
    got = _decide_codec(failed, ["", ""], req(), 2, 7)
    assert got == {"reason": "rank 0: WaitReady failed; rank 1: JoinJob failed", "complete": True}
    got = _decide_codec({0: outcome()}, ["", ""], req(), 2, 7)
    assert got["complete"] is False and "rank(s) [1] did not report" in got["reason"]


def test_a_lane_codec_on_a_switch_without_lanes_is_every_ranks_reason():
    """The assignment's lane_ops false (the TNA program): a job whose codec adds 16/8-bit
    lanes falls back on every rank with one reason; codecs without lanes, and lane codecs
    on a switch with lanes, keep the switch."""
    for codec in ("lowbit16", "lowbit8"):
        none = {0: outcome(codec=codec, lane_ops=False), 1: outcome(codec=codec, lane_ops=False)}
        got = _decide_codec(none, ["", ""], req(), 2, 7)
        assert got["complete"] is True and "codec" not in got
        assert f"codec {codec} adds 16/8-bit lanes" in got["reason"]
        assert "switch s1" in got["reason"] and "TNA" in got["reason"]
        lanes = {0: outcome(codec=codec), 1: outcome(codec=codec)}
        assert _decide_codec(lanes, [codec, "codec="], req(), 2, 7) == {
            "codec": codec,
            "lane_ops": True,
        }
    plain = {0: outcome(lane_ops=False), 1: outcome(lane_ops=True)}  # auto: no lanes then
    assert _decide_codec(plain, ["", ""], req(), 2, 7) == {
        "codec": "fixed_point",
        "lane_ops": False,
    }
