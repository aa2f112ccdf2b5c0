"""Network namespaces and veth links that tests, benchmarks and demos create for
themselves, with sockets opened inside them. Needs root and iproute2."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The repository: the processes the fabric, `make run` and the benchmarks start import the
project from it (their PYTHONPATH or working directory)."""
