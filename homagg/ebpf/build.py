"""Compile the eBPF program (p4src/ebpf/) with clang at set-up, into build/ebpf/ (outside
git): `python -m homagg.ebpf.build`, run by `make ebpf` and by the switch when its object
is missing or older than its sources. The constants header is generated first."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from homagg.ebpf.cheader import render
from homagg.wire.constants import CELLS_PER_PKT

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIR = ROOT / "p4src" / "ebpf"
MAIN_SOURCE = SOURCE_DIR / "homagg_tc.c"
BUILD_DIR = ROOT / "build" / "ebpf"
PROGRAM = "switch_ingress"  # the SEC("tc") function of MAIN_SOURCE
XDP_PROGRAM = "switch_ingress_xdp"  # its SEC("xdp") function: the XDP stage (absorb.h)


def multiarch_include() -> list[str]:
    """Debian keeps asm/ (included by linux/types.h) under the multiarch include directory,
    which clang -target bpf does not search."""
    found = next(Path("/usr/include").glob("*-linux-gnu/asm"), None)
    return ["-I", str(found.parent)] if found is not None else []


def object_path(cells_per_packet: int = CELLS_PER_PKT) -> Path:
    """Where the object of a program of `cells_per_packet` cells is built."""
    return BUILD_DIR / str(cells_per_packet) / "homagg_tc.o"


def build_problem() -> str:
    """Why the program cannot be compiled here ("" when it can)."""
    if shutil.which("clang") is None:
        return "clang is not installed (make venv installs clang, llvm, libbpf-dev, bpftool)"
    if not Path("/usr/include/bpf/bpf_helpers.h").exists():
        return "libbpf-dev is not installed (no bpf/bpf_helpers.h)"
    return ""


def _stale(obj: Path, header: Path) -> bool:
    if not obj.exists():
        return True
    built = obj.stat().st_mtime
    sources = [*SOURCE_DIR.glob("*.[ch]"), header]
    return any(src.stat().st_mtime > built for src in sources)


def build(cells_per_packet: int = CELLS_PER_PKT) -> Path:
    """The object for `cells_per_packet`, compiled unless up to date; RuntimeError with
    clang's message when it fails."""
    problem = build_problem()
    if problem:
        raise RuntimeError(problem)
    obj = object_path(cells_per_packet)
    obj.parent.mkdir(parents=True, exist_ok=True)
    header = obj.parent / "homagg_consts.h"
    text = render(cells_per_packet)
    if not header.exists() or header.read_text() != text:
        header.write_text(text)
    if not _stale(obj, header):
        return obj
    cmd = ["clang", "-O2", "-g", "-Wall", "-target", "bpf", "-I", str(obj.parent)]
    cmd += multiarch_include()
    tmp = obj.with_suffix(".tmp")
    done = subprocess.run(
        [*cmd, "-c", str(MAIN_SOURCE), "-o", str(tmp)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"clang failed on {MAIN_SOURCE.name}:\n{done.stderr}")
    tmp.replace(obj)
    return obj


def main() -> int:
    """Build the object for this environment's cells per packet; prints its path."""
    try:
        print(build())
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
