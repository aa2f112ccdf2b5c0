"""`aggctl top`: a live view of a running controller, redrawn every interval with plain ANSI
(clear and redraw, so it works over SSH and in any terminal), or one JSON document per
refresh with --json; Ctrl-C ends it with status 0. It asks only what the caller's credential
may read (homagg/control/top_view.py) and draws with homagg/control/top_screen.py."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from types import TracebackType
from typing import Any, TextIO

import grpc

from homagg.control.top_screen import render, to_json
from homagg.control.top_view import Sample, Sampler, TopView, build_view

MIN_INTERVAL_S = 0.2  # each refresh reads every switch's counters over P4Runtime

SUMMARY = "a live view: per switch its jobs, their packet rates, resends and drops"
DETAILS = (
    "Redrawn every --interval seconds until Ctrl-C (status 0). Rates are counter deltas\n"
    "between two refreshes. A tenant's credential sees its own jobs; what it may not read\n"
    "is left out and said in one line. --once prints one screen (it waits one interval for\n"
    "the rates); --json prints one JSON document per refresh, one per line. Example:\n"
    "  aggctl top\n  aggctl top --interval 5\n  aggctl top --once --json"
)


def _interval(text: str) -> float:
    value = float(text)
    if not value >= MIN_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"at least {MIN_INTERVAL_S} s, got {text}")
    return value


def add_top_options(parser: argparse.ArgumentParser) -> None:
    """`aggctl top`'s own options (--json, --controller and the rest are aggctl's)."""
    parser.add_argument(
        "--interval",
        type=_interval,
        default=1.0,
        metavar="S",
        help=f"seconds between refreshes (default 1; at least {MIN_INTERVAL_S})",
    )
    parser.add_argument(
        "--once", action="store_true", help="print one refresh (after one interval) and exit"
    )


class Screen:
    """Where refreshes go: a terminal (alternate screen, cursor hidden, cleared and redrawn
    each time, restored on exit), or a pipe (screens one after another), or JSON lines."""

    def __init__(self, out: TextIO, as_json: bool, once: bool) -> None:
        self.out, self.as_json = out, as_json
        self.live = not as_json and not once and out.isatty()

    def __enter__(self) -> Screen:
        if self.live:
            self.out.write("\x1b[?1049h\x1b[?25l")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.live:
            self.out.write("\x1b[?25h\x1b[?1049l")
            self.out.flush()

    def show(self, view: TopView) -> None:
        """Draw one refresh."""
        if self.as_json:
            self._write(json.dumps(to_json(view)) + "\n")
            return
        size = shutil.get_terminal_size((80, 24))
        if self.live:  # home, each line then erase its rest, erase below: no flicker
            text = render(view, size.columns, size.lines)
            self._write("\x1b[H" + text.replace("\n", "\x1b[K\n") + "\x1b[K\x1b[J")
        else:
            self._write(render(view, size.columns) + "\n\n")

    def problem(self, controller: str, text: str) -> None:
        """Say that a refresh failed (the view goes on trying)."""
        line = f"aggctl top  {controller}: {text} (retrying)"
        if self.as_json:
            self._write(
                json.dumps({"controller": controller, "time": time.time(), "error": text}) + "\n"
            )
        elif self.live:
            self._write("\x1b[H\x1b[2J" + line[: shutil.get_terminal_size((80, 24)).columns])
        else:
            self._write(line + "\n\n")

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()


def _error_text(exc: grpc.RpcError) -> str:
    if not isinstance(exc, grpc.Call):
        return str(exc)
    return f"{exc.code().name}: {exc.details()}"


def _loop(args: argparse.Namespace, sampler: Sampler, screen: Screen, first: Sample) -> None:
    """Refresh every interval, forever (Ctrl-C ends it) or once."""
    prev: Sample | None = first
    asked = first.at
    if not args.once:
        screen.show(build_view(None, first, args.controller))
    while True:
        time.sleep(max(0.0, args.interval - (time.monotonic() - asked)))
        asked = time.monotonic()
        try:
            cur = sampler.take()
        except grpc.RpcError as exc:
            if args.once:
                raise
            screen.problem(args.controller, _error_text(exc))
            prev = None  # rates resume over a whole interval once it answers again
            continue
        screen.show(build_view(prev, cur, args.controller))
        if args.once:
            return
        prev = cur


def run_top(args: argparse.Namespace, client: Any) -> int:
    """`aggctl top` on an open client: 0 on Ctrl-C (or after --once). The first sample's
    failure (no controller, bad credential) is raised, for aggctl's one-line error."""
    sampler = Sampler(client)
    try:
        first = sampler.take()
        with Screen(sys.stdout, args.json, args.once) as screen:
            _loop(args, sampler, screen, first)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # e.g. `aggctl top --json | head -1`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0
