#!/bin/sh
# The compose controller: on its first start it makes the secrets in the credentials volume
# (a CA, its certificate, an operator credential: docker/credentials.py), then serves TLS
# with that operator, as `make run` does (docs/controller.md, Security).
set -eu
CREDENTIALS=/credentials
[ -s "$CREDENTIALS/controller.toml" ] || python docker/credentials.py "$CREDENTIALS" docker/controller.toml
exec python -m controller serve --config "$CREDENTIALS/controller.toml"
