"""What a build of the TNA program was made from, as deterministic text: the SHA-256 of
every P4 source it includes (of the text it sees: a shared header's `#ifndef HOMAGG_TNA`
blocks are the v1model program's alone), the target, the cells per packet and the
compiler's version.
`make p4-tofino` writes it beside the P4Info as sources.txt; tests/p4src/test_tofino.py
recomputes it, so a committed build whose sources changed since is caught as stale at once,
whether or not bf-p4c is installed (a fresh compile takes minutes on 2 cores).

    python3 p4src/tofino/sources.py TARGET CELLS "COMPILER VERSION"

Standard library only: the Makefile runs it with the system Python."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

P4SRC = Path(__file__).resolve().parents[1]
# The TNA program's own files and the v1model program's shared headers it includes.
SOURCE_GLOBS = ("tofino/*.p4", "include/*.p4")


TNA_HIDDEN = [b"#ifndef", b"HOMAGG_TNA"]  # opens a block only the v1model program compiles


def tna_text(path: Path) -> bytes:
    """The file as the TNA program sees it: without its `#ifndef HOMAGG_TNA` blocks (nested
    conditionals inside them counted to their matching #endif), so a change to the v1model
    program's part of a shared header does not make the Tofino build stale."""
    kept, depth = [], 0
    for line in path.read_bytes().splitlines(keepends=True):
        words = line.split()[:2]
        if depth == 0 and words == TNA_HIDDEN:
            depth = 1
        elif depth > 0 and words[:1] and words[0].startswith(b"#if"):
            depth += 1
        elif depth > 0 and words[:1] and words[0].startswith(b"#endif"):
            depth -= 1
        elif depth == 0:
            kept.append(line)
    return b"".join(kept)


def source_files() -> list[Path]:
    """Every P4 file the TNA program is built from, in a fixed order."""
    return sorted(p for g in SOURCE_GLOBS for p in P4SRC.glob(g))


def stamp(target: str, cells: int, compiler: str) -> list[str]:
    """The lines of sources.txt for a build with these settings."""
    lines = [f"target: {target}", f"TNA_CELLS: {cells}", f"compiler: {compiler.strip()}"]
    for path in source_files():
        digest = hashlib.sha256(tna_text(path)).hexdigest()
        lines.append(f"{digest}  {path.relative_to(P4SRC.parent).as_posix()}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the stamp for TARGET CELLS COMPILER."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or not args[1].isdigit():
        print(__doc__, file=sys.stderr)
        return 2
    print("\n".join(stamp(args[0], int(args[1]), args[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
