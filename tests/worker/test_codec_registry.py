"""The codec registry in homagg.worker.codecs: names, factories, registration, no torch to list."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from homagg.wire.constants import Op
from homagg.worker import codecs
from homagg.worker.codecs import (
    CODECS,
    FixedPoint,
    Phase,
    lane_codecs,
    make_codec,
    register_codec,
    simulate,
    uses_lanes,
)


def test_every_registered_codec_sums() -> None:
    xs = [np.arange(8, dtype=np.float32) * (r + 1) for r in range(2)]
    for name in CODECS:  # every rank decodes the same sum; exact codecs decode the true one
        out = simulate([make_codec(name, 2, r) for r in range(2)], xs)
        assert out[0].shape == xs[0].shape and np.array_equal(out[0], out[1]), name
        if CODECS[name].exact:
            assert np.allclose(out[0], xs[0] + xs[1], atol=1e-3), name


def test_the_lane_codecs_are_those_that_send_lane_ops() -> None:
    """An entry's `lanes` (what a switch without ADD16 / ADD8 refuses up front) says
    whether the codec's phases use those ops."""
    xs = [np.linspace(-1, 1, 4096, dtype=np.float32) * (r + 1) for r in range(2)]
    for name in CODECS:
        log: list[Phase] = []
        simulate([make_codec(name, 2, r) for r in range(2)], xs, phases_log=log)
        sends = any(p.op in (Op.ADD16, Op.ADD8) for p in log)
        assert uses_lanes(name) == sends, name
    assert lane_codecs() == ("lowbit16", "lowbit8") and not uses_lanes("auto")


def test_unknown_codec_names_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown codec 'nope'; expected one of lossless"):
        make_codec("nope", 2, 0)


def test_register_adds_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codecs, "CODECS", dict(CODECS))
    codecs.register_codec("fp8", lambda world, rank, **o: FixedPoint(world, bits=8, **o))
    assert "fp8" in codecs.CODECS and isinstance(codecs.make_codec("fp8", 2, 0), FixedPoint)
    assert not codecs.CODECS["fp8"].exact and not codecs.uses_lanes("fp8")
    with pytest.raises(ValueError, match="already registered"):
        codecs.register_codec("fp8", lambda world, rank, **o: FixedPoint(world))
    assert "fp8" not in CODECS and register_codec is codecs.register_codec


def test_listing_codecs_does_not_import_torch() -> None:
    code = "import sys, homagg.worker.cli; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
