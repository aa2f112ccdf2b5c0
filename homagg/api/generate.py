"""Compile the controller's job API (homagg/api/jobs.proto) into jobs_pb2.py and
jobs_pb2_grpc.py beside it; the generated modules are git-ignored and rebuilt by `make venv`.

Run: python -m homagg.api.generate
"""

from __future__ import annotations

import sys
from pathlib import Path

from homagg.p4rt.generate import protoc

API_DIR = Path(__file__).resolve().parent


def main() -> int:
    import grpc_tools  # imported late: only the build needs it

    root = API_DIR.parent.parent
    include = Path(grpc_tools.__file__).parent / "_proto"
    protos = sorted(API_DIR.glob("*.proto"))
    protoc(
        [
            f"-I{root}",
            f"-I{include}",
            f"--python_out={root}",
            f"--pyi_out={root}",
            f"--grpc_python_out={root}",
            *[str(p.relative_to(root)) for p in protos],
        ]
    )
    print(f"generated the controller API modules under {API_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
