"""homagg/ebpf/maps.py writes what p4src/ebpf/maps.h declares: every P4 table has a map, the
uplink entry's bytes are the program's struct, and every map's key and value sizes are the
C ones (checked by clang, no root, no kernel)."""

from __future__ import annotations

import ipaddress
import re
import subprocess

import pytest

from homagg.control.artifacts import P4INFO_PATH
from homagg.ebpf import build, cheader, maps
from homagg.p4rt.p4info import P4InfoIndex
from homagg.refswitch.table import Entry
from homagg.wire import p4names


def uplink_entry(job_id: int, **params: int) -> Entry:
    action = P4InfoIndex.from_text_file(P4INFO_PATH).action(p4names.SET_UPLINK)
    return Entry(((job_id, 16),), 0, action, params)


def test_every_p4_table_has_a_map_of_known_size():
    assert set(maps.TABLE_MAPS) == {*p4names.TABLES, *p4names.TREE_TABLES}
    for map_name, counter_map in maps.TABLE_MAPS.values():
        assert map_name in maps.SIZES
        assert counter_map is None or counter_map in maps.SIZES


def test_uplink_entry_is_the_programs_struct():
    """struct uplink_params: port and rank as the program's integers, parent_ip and
    parent_mac as the bytes the program copies into the frame."""
    ip = int(ipaddress.IPv4Address("10.9.8.7"))
    entry = uplink_entry(0x1234, port=510, rank=255, parent_ip=ip, parent_mac=0x020000ABCDEF)
    key = maps.entry_key(p4names.UPLINK, entry)
    value = maps.entry_value(p4names.UPLINK, entry)
    assert key == maps.U32.pack(0x1234)
    assert value[:8] == maps.JOB_RANK.pack(510, 255)
    assert value[8:12] == bytes([10, 9, 8, 7])
    assert value[12:18] == bytes.fromhex("020000abcdef") and value[18:] == b"\0\0"
    assert (len(key), len(value)) == maps.SIZES["uplink"]


@pytest.mark.parametrize(
    ("action", "params", "value"),
    [
        (p4names.OWN_SERVICE, {}, (maps.OWN_SERVICE, 0)),
        (p4names.PEER_SERVICE, {"port": 510}, (maps.PEER_SERVICE, 510)),
    ],
    ids=["own", "peer"],
)
def test_service_source_entry_is_the_programs_struct(action, params, value):
    """struct service_params: the action and the port as the program's integers, keyed by
    the source address in host order (as the program looks it up)."""
    info = P4InfoIndex.from_text_file(P4INFO_PATH).action(action)
    entry = Entry(((0x0A0009FE, 32),), 0, info, params)
    key = maps.entry_key(p4names.SERVICE_SOURCE, entry)
    assert key == maps.U32.pack(0x0A0009FE)
    assert maps.entry_value(p4names.SERVICE_SOURCE, entry) == maps.JOB_RANK.pack(*value)
    assert (len(key), 8) == maps.SIZES["service_source"]


def _declared_maps() -> dict[str, tuple[str, str]]:
    """maps.h's MAP(kind, name, key type, value type, ...) lines: name -> (key, value)."""
    text = (build.SOURCE_DIR / "maps.h").read_text()
    found = re.findall(r"^MAP\(\w+, (\w+), ([\w ]+?), ([\w ]+?), ", text, re.MULTILINE)
    return {name: (key, value) for name, key, value in found}


@pytest.mark.skipif(bool(build.build_problem()), reason=build.build_problem() or "-")
def test_map_sizes_are_the_c_ones(tmp_path):
    declared = _declared_maps()
    assert set(maps.SIZES) <= set(declared)
    asserts = [
        f"_Static_assert(sizeof({declared[name][0]}) == {key} && "
        f'sizeof({declared[name][1]}) == {value}, "{name}");'
        for name, (key, value) in maps.SIZES.items()
    ]
    (tmp_path / "homagg_consts.h").write_text(cheader.render())
    (tmp_path / "check.c").write_text('#include "maps.h"\n' + "\n".join(asserts) + "\n")
    cmd = ["clang", "-fsyntax-only", "-target", "bpf", "-I", str(tmp_path)]
    cmd += ["-I", str(build.SOURCE_DIR), *build.multiarch_include(), str(tmp_path / "check.c")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
