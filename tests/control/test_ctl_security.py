"""The controller's security (docs/controller.md, Security): the operator credential on every
operator call and CreateJob, worker calls bound to their job token, TLS verified against a CA,
the quotas of CreateJob, secrets read from files or the environment, and aggctl's refusals."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import grpc
import pytest
from ctl_helpers import HOSTS, config_dict, join_all, make_config, rpc_code

from homagg.api.client import ControllerClient
from homagg.api.credentials import (
    Operator,
    SecretError,
    authenticate,
    bearer,
    ca_file,
    hash_token,
    job_token,
    operator_token,
)
from homagg.api.tls import TlsError, server_credentials
from homagg.control.cli import main
from homagg.control.config import ConfigError, parse_config
from homagg.control.pki import make_pki
from homagg.environment import (
    CA_FILE_ENV,
    INSECURE_ENV,
    JOB_TOKEN_ENV,
    JOB_TOKEN_FILE_ENV,
    OPERATOR_TOKEN_ENV,
    OPERATOR_TOKEN_FILE_ENV,
)

ALICE, BOB = "-alice-token-begins-with-a-dash", "bob-token"
UNAUTH, EXHAUSTED = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED


def operators(**alice_quota: int) -> list[dict]:
    """Two admin operator tables: alice (with the given quotas) and bob (unlimited). Tenants:
    test_ctl_roles.py."""
    return [
        {"name": "alice", "token_sha256": hash_token(ALICE), "role": "admin", **alice_quota},
        {"name": "bob", "token_sha256": hash_token(BOB), "role": "admin"},
    ]


def secured_config(address: str, tmp_path: Path, tls: bool = True, **controller):
    """One switch, two operators, TLS with a fresh CA (when `tls`)."""
    alice_quota = controller.pop("alice", {})
    doc = config_dict([("s1", address, HOSTS)], tmp_path, **controller)
    doc["operator"] = operators(**alice_quota)
    if tls:
        pki = make_pki(tmp_path / "pki", ["127.0.0.1", "localhost"])
        doc["controller"].update(tls_cert=str(pki.cert), tls_key=str(pki.key))
    return parse_config(doc, tmp_path)


@pytest.fixture
def clean_env(monkeypatch):
    for name in (
        CA_FILE_ENV,
        INSECURE_ENV,
        JOB_TOKEN_ENV,
        JOB_TOKEN_FILE_ENV,
        OPERATOR_TOKEN_ENV,
        OPERATOR_TOKEN_FILE_ENV,
    ):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# -- credentials, unit ---------------------------------------------------------------------


def test_authenticate_matches_the_digest_only():
    ops = [Operator("a", hash_token(ALICE)), Operator("b", hash_token(BOB))]
    assert authenticate(ops, ALICE).name == "a" and authenticate(ops, BOB).name == "b"
    assert authenticate(ops, ALICE + "x") is None
    assert authenticate(ops, "") is None and authenticate(ops, None) is None
    assert authenticate([], ALICE) is None


def test_bearer_reads_only_a_bearer_authorization():
    assert bearer([("x", "y"), ("authorization", "Bearer -t")]) == "-t"
    assert bearer([("authorization", "Basic abc")]) is None
    assert bearer([("authorization", b"Bearer bytes")]) is None
    assert bearer(None) is None and bearer([]) is None


def test_secrets_come_from_a_file_or_the_environment(tmp_path, clean_env):
    assert operator_token() is None and job_token() is None and ca_file() is None
    clean_env.setenv(OPERATOR_TOKEN_ENV, ALICE)
    assert operator_token() == ALICE  # a token beginning with '-' is just a value
    secret = tmp_path / "op.token"
    secret.write_text(BOB + "\n")
    clean_env.setenv(OPERATOR_TOKEN_FILE_ENV, str(secret))
    assert operator_token() == BOB  # the file wins over the variable, newline dropped
    other = tmp_path / "other.token"
    other.write_text("-x\r\n")
    assert operator_token(other) == "-x"  # an explicit file wins over both
    clean_env.setenv(JOB_TOKEN_ENV, "-job")
    assert job_token() == "-job"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SecretError, match="is empty"):
        job_token(tmp_path / "empty")
    with pytest.raises(SecretError, match="cannot read the secret file"):
        job_token(tmp_path / "missing")
    clean_env.setenv(CA_FILE_ENV, "ca.pem")
    assert ca_file() == Path("ca.pem") and ca_file(tmp_path) == tmp_path


# -- configuration ---------------------------------------------------------------------------


def test_config_reads_operators_tls_and_quotas(tmp_path):
    doc = config_dict([("s1", "127.0.0.1:1", HOSTS)], tmp_path, max_job_slots=128)
    doc["controller"].update(tls_cert="tls/c.pem", tls_key="/abs/k.pem", default_pool_size=64)
    doc["operator"] = operators(max_jobs=2, max_slots=100)
    cfg = parse_config(doc, tmp_path)
    assert cfg.tls_cert == tmp_path / "tls/c.pem" and cfg.tls_key == Path("/abs/k.pem")
    assert cfg.max_job_slots == 128
    alice, bob = cfg.operators
    assert (alice.name, alice.max_jobs, alice.max_slots) == ("alice", 2, 100)
    assert (bob.max_jobs, bob.max_slots) == (0, 0) and bob.token_sha256 == hash_token(BOB)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["controller"].update(tls_cert="c.pem"), "tls_cert and controller.tls_key"),
        (lambda d: d["operator"][0].update(token_sha256="abc"), "64 hex digits"),
        (lambda d: d["operator"][0].update(token=ALICE), "unknown key"),
        (lambda d: d["operator"][1].update(name="alice"), "same name"),
        (lambda d: d["operator"][1].update(token_sha256=hash_token(ALICE)), "same token_sha256"),
        (lambda d: d["operator"][0].update(max_slots=5000), "max_slots: 5000 outside"),
        (lambda d: d["controller"].update(max_job_slots=0), "max_job_slots: 0 outside"),
        (lambda d: d["controller"].update(max_job_slots=32), "over the quota"),
    ],
)
def test_config_refuses_bad_security_keys(tmp_path, change, message):
    doc = config_dict([("s1", "127.0.0.1:1", HOSTS)], tmp_path)
    doc["operator"] = operators()
    change(doc)
    with pytest.raises(ConfigError, match=message):
        parse_config(doc, tmp_path)


# -- the operator credential -------------------------------------------------------------------


OPERATOR_CALLS = {
    "CreateJob": lambda c: c.create_job("j", 1, "dense", pool_size=4),
    "Status": lambda c: c.status(),
    "ListJobs": lambda c: c.list_jobs(True),
    "ListPools": lambda c: c.list_pools(),
    "GetCounters": lambda c: c.counters(),
    "ReleaseJob": lambda c: c.release(1),
}


def test_every_operator_call_needs_the_credential(refswitch, tmp_path, start_controller):
    ctl = start_controller(
        secured_config(refswitch.address, tmp_path, tls=False), operator_token=ALICE
    )
    job = ctl.client.create_job("mine", 1, "dense", pool_size=4)
    for presented in (None, "wrong", ALICE[1:]):
        with ControllerClient(ctl.address, 5.0, operator_token=presented, insecure=True) as other:
            for rpc, call in OPERATOR_CALLS.items():
                code, details = rpc_code(lambda: call(other))  # noqa: B023
                assert code == UNAUTH, (rpc, presented)
                assert rpc in details and "operator credential" in details
    with ControllerClient(ctl.address, 5.0, operator_token=BOB, insecure=True) as bob:
        assert bob.status().active_jobs == 1
        # worker calls need the job token, not an operator credential
        h = HOSTS[0]
        joined = bob.join(job.job_id, job.token, 0, h["mac"], h["ip"], 41000, h["switch_port"])
        assert joined.joined == 1
        code, _ = rpc_code(lambda: bob.heartbeat(job.job_id, "not-the-job-token", 0))
        assert code == UNAUTH
        assert bob.heartbeat(job.job_id, job.token, 0).state
        # worker addresses are only in operator answers
        [info] = bob.list_jobs().jobs
        assert info.workers[0].ip == h["ip"] and info.workers[0].mac == h["mac"]
        assert bob.release(job.job_id).job.state == "ended"


# -- quotas ------------------------------------------------------------------------------------


def test_quotas_per_job_and_per_credential(refswitch, tmp_path, start_controller):
    cfg = secured_config(
        refswitch.address,
        tmp_path,
        tls=False,
        max_job_slots=256,
        default_pool_size=16,
        alice={"max_jobs": 2, "max_slots": 100},
    )
    ctl = start_controller(cfg, operator_token=ALICE)
    alice = ctl.client
    code, details = rpc_code(lambda: alice.create_job("big", 1, "dense", pool_size=257))
    assert code == EXHAUSTED and "quota max_job_slots is 256" in details
    code, _ = rpc_code(lambda: alice.create_job("bad", 1, "dense", pool_size=5000))
    assert code == grpc.StatusCode.INVALID_ARGUMENT  # outside the switch, not a quota
    first = alice.create_job("a1", 1, "dense", pool_size=90)
    code, details = rpc_code(lambda: alice.create_job("a2", 1, "dense", pool_size=11))
    assert code == EXHAUSTED
    assert "quota max_slots of operator 'alice' is 100" in details and "hold 90" in details
    alice.create_job("a2", 1, "dense", pool_size=10)
    code, details = rpc_code(lambda: alice.create_job("a3", 1, "dense", pool_size=0))
    assert code == EXHAUSTED and "quota max_jobs of operator 'alice' is 2" in details
    with ControllerClient(ctl.address, 5.0, operator_token=BOB, insecure=True) as bob:
        assert bob.create_job("b1", 1, "dense", pool_size=256).pool_size == 256  # own quota
        assert bob.create_job("b2", 1, "dense").pool_size == 16
        bob.release(first.job_id)  # any operator may release: alice's count drops
    assert alice.create_job("a3", 1, "dense", pool_size=90).pool_size == 90
    # the owners survive a restart: alice is still at her quota of jobs
    ctl.stop()
    again = start_controller(cfg, operator_token=ALICE)
    code, details = rpc_code(lambda: again.client.create_job("a4", 1, "dense", pool_size=1))
    assert code == EXHAUSTED and "max_jobs" in details


# -- TLS -----------------------------------------------------------------------------------------


def test_tls_is_verified_against_the_ca(refswitch, tmp_path, start_controller):
    cfg = secured_config(refswitch.address, tmp_path)
    ca = tmp_path / "pki" / "ca.crt"
    ctl = start_controller(cfg, ca_file=ca, operator_token=ALICE)
    assert ctl.client.status().switches[0].connected
    job = ctl.client.create_job("tls", 1, "dense", pool_size=4)
    join_all(ctl.client, job, HOSTS[:1])
    with ControllerClient(ctl.address, 2.0, operator_token=ALICE, insecure=True) as plain:
        code, _ = rpc_code(plain.status)
        assert code == grpc.StatusCode.UNAVAILABLE  # a plaintext client gets no answer
    stranger = make_pki(tmp_path / "other", ["127.0.0.1"])
    with ControllerClient(ctl.address, 2.0, stranger.ca, ALICE) as fooled:
        code, _ = rpc_code(fooled.status)
        assert code == grpc.StatusCode.UNAVAILABLE  # a certificate of another CA is refused
    with ControllerClient(ctl.address, 2.0, ca, ALICE, server_name="elsewhere.example") as wrong:
        code, _ = rpc_code(wrong.status)
        assert code == grpc.StatusCode.UNAVAILABLE  # the certificate does not name that host


@pytest.mark.parametrize("backend", ["cryptography", "openssl"])
def test_both_pki_backends_serve_tls(refswitch, tmp_path, start_controller, backend):
    if backend == "openssl" and shutil.which("openssl") is None:
        pytest.skip("no openssl command")
    if backend == "cryptography":
        pytest.importorskip("cryptography")
    pki = make_pki(tmp_path / "pki", ["127.0.0.1", "localhost"], backend=backend)
    assert pki.key.stat().st_mode & 0o777 == 0o600 and not (tmp_path / "pki" / "ca.key").exists()
    cfg = secured_config(refswitch.address, tmp_path, tls=False)
    cfg = dataclasses.replace(cfg, tls_cert=pki.cert, tls_key=pki.key)
    ctl = start_controller(cfg, ca_file=pki.ca, operator_token=BOB)
    assert ctl.client.status().switches[0].connected
    with ControllerClient(ctl.address, 2.0, pki.ca, BOB, server_name="localhost") as by_name:
        assert by_name.list_pools().ranges is not None  # the DNS name is in the certificate too


def test_make_pki_files(tmp_path):
    pki = make_pki(tmp_path / "d", ["10.0.0.100"])
    assert pki.key.stat().st_mode & 0o777 == 0o600
    assert b"BEGIN CERTIFICATE" in pki.ca.read_bytes() and b"PRIVATE KEY" in pki.key.read_bytes()
    with pytest.raises(ValueError, match="at least one host"):
        make_pki(tmp_path / "e", [])
    with pytest.raises(TlsError, match="cannot read the CA file"):
        ControllerClient("127.0.0.1:1", 1.0, tmp_path / "missing.crt")
    (tmp_path / "junk.crt").write_text("junk")
    with pytest.raises(TlsError, match="is not PEM"):
        ControllerClient("127.0.0.1:1", 1.0, tmp_path / "junk.crt")


# -- aggctl ---------------------------------------------------------------------------------------


def test_aggctl_over_tls_with_a_credential_file(
    refswitch, tmp_path, start_controller, clean_env, capsys
):
    cfg = secured_config(refswitch.address, tmp_path)
    ca = tmp_path / "pki" / "ca.crt"
    ctl = start_controller(cfg, ca_file=ca, operator_token=ALICE)
    job = ctl.client.create_job("cli", 1, "dense", pool_size=4)
    join_all(ctl.client, job, HOSTS[:1])
    secret = tmp_path / "alice.token"
    secret.write_text(ALICE + "\n")
    base = ["--controller", ctl.address, "--ca-file", str(ca)]
    capsys.readouterr()
    assert main([*base, "--credential-file", str(secret), "jobs", "--ranks", "--json"]) == 0
    [info] = json.loads(capsys.readouterr().out)["jobs"]
    assert info["workers"][0]["ip"] == HOSTS[0]["ip"]  # the operator sees the addresses
    clean_env.setenv(CA_FILE_ENV, str(ca))
    clean_env.setenv(OPERATOR_TOKEN_ENV, ALICE)
    assert main(["--controller", ctl.address, "status"]) == 0
    clean_env.delenv(OPERATOR_TOKEN_ENV)
    capsys.readouterr()
    assert main(["--controller", ctl.address, "jobs", "--ranks"]) == 1  # no credential
    assert HOSTS[0]["ip"] not in capsys.readouterr().out


def test_aggctl_errors_say_what_to_give(refswitch, tmp_path, start_controller, clean_env, capsys):
    cfg = secured_config(refswitch.address, tmp_path)
    ca = tmp_path / "pki" / "ca.crt"
    ctl = start_controller(cfg, ca_file=ca, operator_token=ALICE)
    capsys.readouterr()
    assert main(["--controller", ctl.address, "status"]) == 2
    err = capsys.readouterr().err
    assert "--ca-file" in err and "--insecure" in err
    assert main(["--controller", ctl.address, "--ca-file", str(ca), "jobs", "--json"]) == 1
    err = capsys.readouterr().err
    assert "UNAUTHENTICATED" in err and "--credential-file" in err
    empty = tmp_path / "empty"
    empty.write_text("")
    assert main(["--ca-file", str(ca), "--credential-file", str(empty), "status"]) == 2
    assert "is empty" in capsys.readouterr().err
    assert main(["--ca-file", str(tmp_path / "nope.crt"), "status"]) == 2
    assert "cannot read the CA file" in capsys.readouterr().err


def test_serve_refuses_to_run_insecurely(tmp_path, capsys):
    doc = config_dict([("s1", "127.0.0.1:1", HOSTS)], tmp_path)
    lines = ["[controller]", f'database = "{tmp_path / "c.db"}"', 'listen = "127.0.0.1:0"']
    sw = doc["switch"][0]
    lines += ["[[switch]]"] + [f'{k} = "{sw[k]}"' for k in ("name", "address", "mac", "service_ip")]
    config = tmp_path / "c.toml"
    config.write_text("\n".join(lines) + "\n")
    assert main(["serve", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "refusing to serve insecurely" in err and "no TLS certificate" in err
    assert "no [[operator]] credential" in err and "--insecure" in err
    assert main(["serve", "--config", str(config), "--tls-cert", "c.pem"]) == 2
    assert "--tls-cert and --tls-key go together" in capsys.readouterr().err


def test_make_config_stays_plaintext_for_the_other_tests(tmp_path):
    cfg = make_config("127.0.0.1:1", tmp_path)
    assert cfg.tls_cert is None and cfg.operators == ()


WORKER_CALLS = {"JoinJob", "WaitReady", "Heartbeat", "LeaveJob"}  # bound to the job token


def test_every_rpc_is_an_operator_or_a_worker_call():
    """A new RPC must be added to one of the two lists (and guarded like them)."""
    from homagg.api import jobs_pb2

    methods = set(jobs_pb2.DESCRIPTOR.services_by_name["Controller"].methods_by_name)
    assert methods == set(OPERATOR_CALLS) | WORKER_CALLS


def test_serve_names_an_unreadable_certificate(tmp_path, capsys):
    doc = config_dict([("s1", "127.0.0.1:1", HOSTS)], tmp_path)
    sw = doc["switch"][0]
    lines = ["[controller]", f'database = "{tmp_path / "c.db"}"', 'listen = "127.0.0.1:0"']
    lines += ["[[switch]]"] + [f'{k} = "{sw[k]}"' for k in ("name", "address", "mac", "service_ip")]
    config = tmp_path / "c.toml"
    config.write_text("\n".join(lines) + "\n")
    (tmp_path / "junk.pem").write_text("not a certificate")
    argv = ["serve", "--insecure", "--config", str(config), "--tls-key", str(tmp_path / "k")]
    assert main([*argv, "--tls-cert", str(tmp_path / "junk.pem")]) == 1
    err = capsys.readouterr().err
    assert "cannot read the TLS key" in err or "is not PEM" in err
    assert "Traceback" not in err


def test_server_credentials_check_the_pair(tmp_path):
    a, b = make_pki(tmp_path / "a", ["127.0.0.1"]), make_pki(tmp_path / "b", ["127.0.0.1"])
    server_credentials(a.cert, a.key)
    with pytest.raises(TlsError, match="is not the key of the certificate"):
        server_credentials(a.cert, b.key)
    junk = tmp_path / "junk.pem"
    junk.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    with pytest.raises(TlsError, match="does not parse"):
        server_credentials(junk, a.key)
