#!/bin/sh
# The compose controller: on its first start it makes the secrets in the credentials volume
# (a CA, its certificate, the tenant credential rank 0 creates the job with:
# docker/credentials.py) and the admin credential in a volume of its own (for aggctl:
# docker compose exec controller cat /admin/admin.token), then serves TLS with those
# operators, as `make run` does (docs/controller.md, Security).
set -eu
CREDENTIALS=/credentials
[ -s "$CREDENTIALS/controller.toml" ] ||
  python docker/credentials.py "$CREDENTIALS" docker/controller.toml /admin
exec python -m homagg.control serve --config "$CREDENTIALS/controller.toml"
