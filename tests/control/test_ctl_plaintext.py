"""Plaintext is an explicit choice of every client (homagg/api/tls.py): ControllerClient, the
worker agent, aggctl and `python -m homagg.worker` verify the controller against a CA (the argument
or $HOMAGG_CA_FILE), talk plaintext only when told (insecure=True, --insecure or
$HOMAGG_INSECURE=1; warned once per process), and otherwise refuse before sending anything,
saying what to set. homagg.attach and homagg-run: tests/worker/test_attach.py and
tests/worker/test_launch.py."""

from __future__ import annotations

import logging
import threading

import pytest
from ctl_helpers import make_config

from homagg.api import tls
from homagg.api.client import ControllerClient
from homagg.api.tls import TlsError
from homagg.control.cli import main
from homagg.control.pki import make_pki
from homagg.environment import CA_FILE_ENV, INSECURE_ENV
from homagg.worker.cli import main as worker_main
from homagg.worker.job.agent import AgentConfig, open_agent


@pytest.fixture
def env(monkeypatch):
    """No CA and no plaintext choice in the environment; the once-per-process warning reset."""
    monkeypatch.delenv(CA_FILE_ENV, raising=False)
    monkeypatch.delenv(INSECURE_ENV, raising=False)
    monkeypatch.setattr(tls, "_plaintext_warned", threading.Event())
    return monkeypatch


def test_a_client_without_a_choice_is_refused(env):
    with pytest.raises(TlsError) as info:
        ControllerClient("10.9.9.9:50051", 1.0, operator_token="secret")
    text = str(info.value)
    assert "no CA to verify the controller at 10.9.9.9:50051" in text
    assert f"${CA_FILE_ENV}" in text and f"${INSECURE_ENV}=1" in text and "insecure=True" in text


def test_the_choice_comes_from_the_arguments_or_the_environment(env, tmp_path, caplog):
    pki = make_pki(tmp_path / "pki", ["127.0.0.1"])
    with ControllerClient("127.0.0.1:1", 1.0, pki.ca) as by_argument:
        assert by_argument.secure
    env.setenv(CA_FILE_ENV, str(pki.ca))
    with ControllerClient("127.0.0.1:1", 1.0) as by_environment:
        assert by_environment.secure
    with ControllerClient("127.0.0.1:1", 1.0, insecure=True) as explicit:
        assert not explicit.secure  # the explicit choice wins over the environment's CA
    env.delenv(CA_FILE_ENV)
    env.setenv(INSECURE_ENV, "1")
    with caplog.at_level(logging.WARNING, logger="homagg.api.tls"):
        for _ in range(3):
            with ControllerClient("127.0.0.1:1", 1.0) as plain:
                assert not plain.secure
    warned = [r.getMessage() for r in caplog.records if "INSECURE" in r.getMessage()]
    assert len(warned) == 1 and "job tokens and the operator credential" in warned[0]
    with pytest.raises(TlsError, match="not both"):
        ControllerClient("127.0.0.1:1", 1.0, pki.ca, insecure=True)
    for value in ("yes", "true", "2"):
        env.setenv(INSECURE_ENV, value)
        with pytest.raises(TlsError, match=f"{INSECURE_ENV}='{value}': set it to 1"):
            ControllerClient("127.0.0.1:1", 1.0)
    env.setenv(INSECURE_ENV, "0")
    with pytest.raises(TlsError, match="no CA to verify"):
        ControllerClient("127.0.0.1:1", 1.0)


def _agent_config(**kw) -> AgentConfig:
    fields = dict(controller="127.0.0.1:1", job_id=1, token="t", rank=0, ip="127.0.0.1")
    return AgentConfig(**{**fields, "udp_port": 0, "mac": "02:00:00:00:00:01", **kw})


def test_an_agent_without_a_choice_gets_a_reason(env):
    agent, reason = open_agent(_agent_config())
    assert agent is None and "no CA to verify the controller" in reason
    assert f"{INSECURE_ENV}=1" in reason


def test_aggctl_and_the_worker_cli_take_the_environments_choice(
    refswitch, tmp_path, start_controller, env, capsys
):
    ctl = start_controller(make_config(refswitch.address, tmp_path))  # plaintext
    base = ["--controller", ctl.address]
    assert main([*base, "status"]) == 2
    err = capsys.readouterr().err
    assert "--ca-file" in err and "--insecure" in err and f"${INSECURE_ENV}=1" in err
    create = ["create", *base, "--world-size", "1", "--name", "w"]
    assert worker_main(create) == 2
    assert f"${INSECURE_ENV}=1" in capsys.readouterr().err
    env.setenv(INSECURE_ENV, "1")
    assert main([*base, "status"]) == 0
    assert worker_main(create) == 0
    assert "job_id=" in capsys.readouterr().out
    env.setenv(INSECURE_ENV, "maybe")
    assert main([*base, "status"]) == 2
    assert f"{INSECURE_ENV}='maybe'" in capsys.readouterr().err
