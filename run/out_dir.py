"""The run's output directory: `--out` may name a new or empty directory, or one an earlier
run wrote (it carries a marker file); the run empties only such a directory, so that a
mistyped `--out` (a home or source directory) never loses a user's files."""

from __future__ import annotations

from pathlib import Path

MARKER = ".homagg-run-out"


class OutDirError(ValueError):
    """`--out` names a directory that holds files no earlier run wrote."""


def check(out: Path) -> None:
    """Refuse an `--out` that exists and is not a directory, or holds foreign files."""
    if not out.exists():
        return
    if not out.is_dir():
        raise OutDirError(f"--out {out} is not a directory: name a new or empty directory")
    if (out / MARKER).exists():
        return
    entries = sorted(p.name for p in out.iterdir())
    if entries:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise OutDirError(
            f"--out {out} holds {len(entries)} entries no earlier run wrote ({shown}): "
            "name a new or empty directory, or the --out of an earlier run"
        )


def prepare(out: Path, *, own: bool = False) -> None:
    """Create or mark `out`, and remove the files an earlier run left at its top level
    (`own`: the run's own directory, emptied whatever it holds)."""
    if not own:
        check(out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*"):
        if old.is_file():
            old.unlink()
    (out / MARKER).write_text("written by python -m run; the next run into here empties it\n")
