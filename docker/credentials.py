"""The secrets of the compose job, made once in its credentials volume as `make run` makes
them (run/credentials.py): a CA, the controller's certificate for the name the workers dial
("controller") and for the host's loopback (the published port), a tenant credential (rank
0 creates the job with it) and an admin credential (aggctl on the host), mode 0600, and the
controller's configuration: docker/controller.toml with TLS and those operators. The admin
credential goes to a volume of the controller alone (the workers mount the other one).
Usage: python docker/credentials.py DIRECTORY TEMPLATE ADMIN_DIRECTORY"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from homagg.lab.controller_process import config_toml
from run.credentials import make_run_credentials

CONTROLLER_NAME = "controller"  # the compose service the workers dial


def make_credentials(directory: Path, template: Path, admin_directory: Path) -> Path:
    """Write the secrets and the secured configuration into `directory`, the admin credential
    into `admin_directory` (the controller's alone); returns the configuration."""
    creds = make_run_credentials(directory, CONTROLLER_NAME, admin_directory)
    doc = tomllib.loads(template.read_text())
    doc["controller"].update(creds.controller_keys())
    doc["operator"] = creds.operators()
    config = directory / "controller.toml"
    partial = config.with_suffix(".tmp")
    partial.write_text(config_toml(doc))
    partial.rename(config)  # written last: the workers wait for it
    return config


if __name__ == "__main__":
    print(make_credentials(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])))
