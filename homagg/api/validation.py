"""Checks of request fields, each raising InvalidArgument with a message that names the
field, and the job tokens (random, stored only as a hash, compared in constant time).

The ranges of a job's values are defined here once: the controller checks requests against
them and the worker its assignment (homagg/worker/job/agent.py), so the two cannot drift."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import re
import secrets

from homagg.api.errors import InvalidArgument
from homagg.p4rt.bytestrings import int_to_mac, ipv4_to_int, mac_to_int
from homagg.wire.constants import (
    MAX_JOB_ID,
    MAX_L4_PORT,
    MAX_RANKS,
    MAX_SWITCH_PORT,
    NUM_SLOTS,
)

CODEC_PATTERN = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")
DEFAULT_WAIT = 30.0
MAX_WAIT = 300.0
LIMITED_BROADCAST = ipaddress.IPv4Address("255.255.255.255")

JOB_IDS = range(1, MAX_JOB_ID + 1)  # 0 is never assigned
# Up to 32 on one switch (one bit each in the slot's seen bitmap), up to 256 (the header's
# 8-bit rank) on a tree of switches: the controller checks its topology can hold the job.
WORLD_SIZES = range(1, MAX_RANKS + 1)
POOL_SIZES = range(1, NUM_SLOTS + 1)
UDP_PORTS = range(1, MAX_L4_PORT + 1)
SWITCH_PORTS = range(MAX_SWITCH_PORT + 1)


def span(values: range) -> str:
    """A range as messages write it: "1..32"."""
    return f"{values.start}..{values.stop - 1}"


def is_unicast(address: ipaddress.IPv4Address) -> bool:
    """Whether an IPv4 address can be a host's: not 0.0.0.0, 255.255.255.255 or multicast."""
    return not (address.is_unspecified or address == LIMITED_BROADCAST or address.is_multicast)


def check_name(name: str) -> str:
    """A job name: 1..64 printable characters."""
    if not 1 <= len(name) <= 64 or not name.isprintable():
        raise InvalidArgument(f"name: expected 1..64 printable characters, got {name!r}")
    return name


def check_codec(codec: str) -> str:
    """A codec name: 1..64 of [A-Za-z0-9_.+-]."""
    if not CODEC_PATTERN.match(codec):
        raise InvalidArgument(f"codec: expected 1..64 of [A-Za-z0-9_.+-], got {codec!r}")
    return codec


def check_world_size(world_size: int) -> int:
    """Ranks in a job: 1..256 (the header's 8-bit rank); above 32 (a switch's seen bitmap)
    only on a tree of switches, which the controller checks against its topology."""
    if world_size not in WORLD_SIZES:
        raise InvalidArgument(f"world_size: {world_size} outside {span(WORLD_SIZES)}")
    return world_size


def check_pool_size(pool_size: int, default: int) -> int:
    """Slots requested: 0 means the default, else 1..NUM_SLOTS."""
    if pool_size == 0:
        return default
    if pool_size not in POOL_SIZES:
        raise InvalidArgument(
            f"pool_size: {pool_size} slots outside {span(POOL_SIZES)} (0: the default, {default})"
        )
    return pool_size


def check_rank(rank: int, world_size: int = MAX_RANKS) -> int:
    """A rank of the job: 0..world_size-1."""
    if not 0 <= rank < world_size:
        raise InvalidArgument(f"rank: {rank} outside the job's ranks 0..{world_size - 1}")
    return rank


def check_mac(mac: str) -> str:
    """A MAC address, returned in canonical lower-case colon form."""
    try:
        return int_to_mac(mac_to_int(mac))
    except ValueError:
        raise InvalidArgument(f"mac: not a MAC address: {mac!r}") from None


def check_ip(ip: str) -> str:
    """A dotted-quad IPv4 unicast address (not 0.0.0.0, 255.255.255.255 or multicast)."""
    try:
        address = ipaddress.IPv4Address(ipv4_to_int(ip))
    except ValueError:
        raise InvalidArgument(f"ip: not an IPv4 address: {ip!r}") from None
    if not is_unicast(address):
        raise InvalidArgument(f"ip: {ip} is not a unicast host address")
    return ip


def check_udp_port(port: int) -> int:
    """The worker's UDP port: 1..65535."""
    if port not in UDP_PORTS:
        raise InvalidArgument(f"udp_port: {port} outside {span(UDP_PORTS)}")
    return port


def check_switch_port(port: int) -> int:
    """A switch port a host can be on: 0..510 (511 is v1model's drop port)."""
    if port not in SWITCH_PORTS:
        raise InvalidArgument(f"switch_port: {port} outside {span(SWITCH_PORTS)}")
    return port


def check_timeout(timeout: float) -> float:
    """WaitReady's timeout: 0 means 30 s, else (0, 300] seconds."""
    if timeout == 0:
        return DEFAULT_WAIT
    if not math.isfinite(timeout) or not 0 < timeout <= MAX_WAIT:
        raise InvalidArgument(
            f"timeout_s: {timeout} outside (0, {MAX_WAIT:g}] (0: {DEFAULT_WAIT:g} s)"
        )
    return timeout


TOKEN_PREFIX = "hgt_"


def new_token() -> tuple[str, str]:
    """A fresh job token and the hash that is stored instead of it. The prefix keeps a
    token from starting with '-' (a command line would read it as an option) and lets
    secret scanners recognize it."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(24)
    return token, hash_token(token)


def hash_token(token: str) -> str:
    """SHA-256 of the token, hex."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(token: str, token_hash: str) -> bool:
    """Constant-time comparison of a presented token with the stored hash."""
    return hmac.compare_digest(hash_token(token), token_hash)
