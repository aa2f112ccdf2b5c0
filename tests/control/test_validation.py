"""Unit tests of homagg/api/validation.py: the ranges of a job's values and the job tokens."""

from __future__ import annotations

import pytest

from homagg.api.errors import InvalidArgument
from homagg.api.validation import (
    JOB_IDS,
    POOL_SIZES,
    SWITCH_PORTS,
    TOKEN_PREFIX,
    UDP_PORTS,
    WORLD_SIZES,
    check_switch_port,
    check_udp_port,
    check_world_size,
    hash_token,
    new_token,
    span,
    token_matches,
)
from homagg.wire.constants import DROP_PORT, MAX_JOB_ID, MAX_RANKS, NUM_SLOTS


def test_the_ranges_follow_from_the_data_plane():
    assert span(JOB_IDS) == f"1..{MAX_JOB_ID}" and span(WORLD_SIZES) == f"1..{MAX_RANKS}"
    assert span(POOL_SIZES) == f"1..{NUM_SLOTS}" and span(UDP_PORTS) == "1..65535"
    assert DROP_PORT not in SWITCH_PORTS and span(SWITCH_PORTS) == "0..510"


@pytest.mark.parametrize(
    ("check", "bad", "message"),
    [
        (check_switch_port, DROP_PORT, "switch_port: 511 outside 0..510"),
        (check_udp_port, 0, "udp_port: 0 outside 1..65535"),
        (check_udp_port, 65536, "udp_port: 65536 outside 1..65535"),
        (check_world_size, 257, "world_size: 257 outside 1..256"),
        (check_world_size, 0, "world_size: 0 outside 1..256"),
    ],
)
def test_checks_refuse_values_outside_the_ranges(check, bad, message):
    with pytest.raises(InvalidArgument, match=message):
        check(bad)


def test_tokens_never_read_as_command_line_options():
    # token_urlsafe alone starts with '-' about once in 64 tokens; argparse then takes
    # `--token -abc` for two options (a CI failure seen once)
    for _ in range(2000):
        token, digest = new_token()
        assert token.startswith(TOKEN_PREFIX) and not token.startswith("-")
        assert digest == hash_token(token) and token not in digest


def test_token_matches_only_its_own_hash():
    token, digest = new_token()
    other, _ = new_token()
    assert token != other
    assert token_matches(token, digest)
    assert not token_matches(other, digest)
    assert not token_matches(token[:-1], digest)
