"""homagg.lab.controller_process: `aggctl serve` started and awaited one way, plaintext for
tests and on TLS with an operator credential for `make run`; a controller that exits or
never syncs is a RuntimeError with its log, within the bound."""

from __future__ import annotations

import time

import grpc
import pytest

from homagg.api.client import ControllerClient
from homagg.api.credentials import operator_token
from homagg.lab.addresses import SWITCH_MAC
from homagg.lab.controller_process import ControllerProcess, write_toml
from homagg.lab.switch_process import free_port
from homagg.refswitch.switch import ReferenceSwitch
from run.credentials import make_run_credentials


def doc(tmp_path, switch_address: str, listen: str) -> dict:
    return {
        "controller": {"listen": listen, "database": str(tmp_path / "controller.db")},
        "switch": [
            {"name": "s1", "address": switch_address, "mac": SWITCH_MAC, "service_ip": "10.0.0.254"}
        ],
    }


def test_tls_controller_with_an_operator_credential(tmp_path):
    creds = make_run_credentials(tmp_path / "credentials", "127.0.0.1")
    switch_address = f"127.0.0.1:{free_port()}"
    switch = ReferenceSwitch({}, switch_address)
    switch.start()
    listen = f"127.0.0.1:{free_port()}"
    d = doc(tmp_path, switch_address, listen)
    d["controller"].update(creds.controller_keys())
    d["operator"] = creds.operators()
    token = operator_token(creds.admin_token_file)  # it polls Status: an admin call
    ctl = ControllerProcess(
        write_toml(d, tmp_path / "c.toml"), listen, tmp_path / "c.log", ca=creds.ca, token=token
    )
    try:
        with ctl.start(30) as client:
            assert client.secure and [s.connected for s in client.status().switches] == [True]
            assert client.create_job("tls", 1, "lossless").job_id >= 1  # the credential works
        with ControllerClient(listen, 2.0, insecure=True) as plain, pytest.raises(grpc.RpcError):
            plain.status()  # no TLS: refused
    finally:
        ctl.stop()
        switch.close()
    assert ctl.proc is not None and ctl.proc.poll() is not None


def test_a_controller_that_exits_is_reported_with_its_log(tmp_path):
    listen = f"127.0.0.1:{free_port()}"
    d = doc(tmp_path, "127.0.0.1:1", listen)
    d["controller"]["lease"] = -1.0  # refused by the configuration check
    ctl = ControllerProcess(write_toml(d, tmp_path / "c.toml"), listen, tmp_path / "c.log")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?s)exited.*lease"):
        ctl.start(30)
    assert time.monotonic() - start < 20


def test_a_controller_that_never_syncs_times_out_and_is_killed(tmp_path):
    listen = f"127.0.0.1:{free_port()}"
    unreachable = f"127.0.0.1:{free_port()}"  # nobody serves P4Runtime there
    ctl = ControllerProcess(
        write_toml(doc(tmp_path, unreachable, listen), tmp_path / "c.toml"),
        listen,
        tmp_path / "c.log",
    )
    try:
        with pytest.raises(RuntimeError, match="not synced in 2"):
            ctl.start(2)
    finally:
        ctl.kill()
    assert ctl.proc is not None and ctl.proc.poll() is not None
