"""make run's secrets: a CA, a certificate for the controller's address and an operator
credential in the run directory, a configuration the controller accepts, and environments
that name files (never a secret)."""

from __future__ import annotations

import tomllib

from controller.config import parse_config
from controller.credentials import (
    CA_FILE_ENV,
    OPERATOR_TOKEN_FILE_ENV,
    authenticate,
    operator_token,
)
from run.credentials import make_run_credentials
from testnet.controller_process import config_toml


def test_make_run_credentials_and_the_controller_config(tmp_path):
    creds = make_run_credentials(tmp_path / "credentials", "10.0.1.100")
    for path in (creds.ca, creds.cert, creds.key, creds.operator_token_file):
        assert path.is_file() and path.parent == tmp_path / "credentials"
    assert creds.key.stat().st_mode & 0o777 == 0o600
    assert creds.operator_token_file.stat().st_mode & 0o777 == 0o600
    token = operator_token(creds.operator_token_file)
    assert token and creds.token_sha256 not in (token, "")
    doc = {
        "controller": {"listen": "10.0.1.100:50051", "database": "c.db"},
        "switch": [
            {"name": "s1", "address": "127.0.0.1:1", "mac": "02:00:00:00:00:fe"}
            | {"service_ip": "10.0.1.254"}
        ],
    }
    doc["controller"].update(creds.controller_keys())
    doc["operator"] = creds.operators()
    cfg = parse_config(tomllib.loads(config_toml(doc)), tmp_path)
    assert cfg.tls_cert == creds.cert and cfg.tls_key == creds.key
    assert authenticate(cfg.operators, token).name == "make-run"
    assert creds.client_env(operator=False) == {CA_FILE_ENV: str(creds.ca)}
    env = creds.client_env(operator=True)
    assert env[OPERATOR_TOKEN_FILE_ENV] == str(creds.operator_token_file)
    assert token not in " ".join([*env.values(), *creds.aggctl_args()])
    again = make_run_credentials(tmp_path / "credentials", "10.0.1.100")
    assert operator_token(again.operator_token_file) != token  # a new run, new secrets
