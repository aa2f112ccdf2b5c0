"""make run's secrets: a CA, a certificate for the controller's address, a tenant credential
(rank 0's) and an admin credential (the run's own calls) in the run directory, a
configuration the controller accepts with those roles, and environments that name files
(never a secret)."""

from __future__ import annotations

import tomllib

from homagg.api.credentials import authenticate, operator_token
from homagg.control.config import parse_config
from homagg.environment import CA_FILE_ENV, OPERATOR_TOKEN_FILE_ENV
from homagg.lab.controller_process import config_toml
from run.credentials import make_run_credentials


def test_make_run_credentials_and_the_controller_config(tmp_path):
    creds = make_run_credentials(tmp_path / "credentials", "10.0.1.100")
    files = (creds.ca, creds.cert, creds.key, creds.tenant_token_file, creds.admin_token_file)
    for path in files:
        assert path.is_file() and path.parent == tmp_path / "credentials"
    for secret in (creds.key, creds.tenant_token_file, creds.admin_token_file):
        assert secret.stat().st_mode & 0o777 == 0o600
    tenant = operator_token(creds.tenant_token_file)
    admin = operator_token(creds.admin_token_file)
    assert tenant and admin and tenant != admin
    doc = {
        "controller": {"listen": "10.0.1.100:50051", "database": "c.db"},
        "switch": [
            {"name": "s1", "address": "127.0.0.1:1", "mac": "02:00:00:00:00:fe"}
            | {"service_ip": "10.0.1.254"}
        ],
    }
    doc["controller"].update(creds.controller_keys())
    doc["operator"] = creds.operators()
    text = config_toml(doc)
    assert tenant not in text and admin not in text  # digests only
    cfg = parse_config(tomllib.loads(text), tmp_path)
    assert cfg.tls_cert == creds.cert and cfg.tls_key == creds.key
    rank0 = authenticate(cfg.operators, tenant)
    assert (rank0.name, rank0.role, rank0.max_jobs) == ("make-run", "tenant", 2)
    assert authenticate(cfg.operators, admin).admin
    assert creds.client_env(operator=False) == {CA_FILE_ENV: str(creds.ca)}
    env = creds.client_env(operator=True)
    assert env[OPERATOR_TOKEN_FILE_ENV] == str(creds.tenant_token_file)  # rank 0: the tenant
    assert str(creds.admin_token_file) in creds.aggctl_args()  # aggctl counters: the admin
    assert tenant not in " ".join([*env.values(), *creds.aggctl_args()])
    again = make_run_credentials(tmp_path / "credentials", "10.0.1.100")
    assert operator_token(again.tenant_token_file) != tenant  # a new run, new secrets
    elsewhere = make_run_credentials(tmp_path / "c2", "10.0.1.100", tmp_path / "admin")
    assert elsewhere.admin_token_file.parent == tmp_path / "admin"
    assert not (tmp_path / "c2" / "admin.token").exists()
