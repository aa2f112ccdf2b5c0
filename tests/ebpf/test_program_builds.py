"""The eBPF program's constants come from homagg.wire, and the program compiles with
them (clang only: no root, no kernel)."""

from __future__ import annotations

import subprocess

import pytest

from homagg.ebpf import build, cheader
from homagg.wire.constants import DropReason, Event, Op
from homagg.wire.header import AGG_HEADER_FIELDS


def test_header_defines_every_code_of_homagg_wire():
    text = cheader.render(64)
    for reason in DropReason:
        assert f"#define DROP_{reason.name} {int(reason)}u" in text
    for op in Op:
        assert f"#define AGG_OP_{op.name} {int(op)}u" in text
    for event in Event:
        assert f"#define EVENT_{event.name} {int(event)}u" in text
    assert "#define CELLS_PER_PKT 64u" in text and "#define AGG_UDP_LENGTH 280u" in text
    fields = [line.split()[-1].rstrip(";") for line in text.splitlines() if line[:6] == "    __"]
    assert fields == [f.name for f in AGG_HEADER_FIELDS]


def test_table_sizes_are_read_from_the_p4_constants(tmp_path):
    p4 = tmp_path / "constants.p4"
    p4.write_text("#define MAX_JOBS 7\n#define MAX_WORKERS 8\n#define IPV4_TABLE_SIZE 9\n")
    with pytest.raises(ValueError, match="ARP_TABLE_SIZE"):
        cheader.table_sizes(p4)
    p4.write_text(p4.read_text() + "#define ARP_TABLE_SIZE 10\n")
    with pytest.raises(ValueError, match="SERVICE_SOURCE_TABLE_SIZE"):
        cheader.table_sizes(p4)
    p4.write_text(p4.read_text() + "#define SERVICE_SOURCE_TABLE_SIZE 11\n")
    sizes = cheader.table_sizes(p4)
    assert (sizes["ARP_TABLE_SIZE"], sizes["SERVICE_SOURCE_TABLE_SIZE"]) == (10, 11)


@pytest.mark.skipif(bool(build.build_problem()), reason=build.build_problem() or "-")
@pytest.mark.parametrize("cells", [64, 256])
def test_program_compiles_with_the_generated_header(tmp_path, cells):
    (tmp_path / "homagg_consts.h").write_text(cheader.render(cells))
    cmd = ["clang", "-O2", "-g", "-Wall", "-Werror", "-target", "bpf", "-I", str(tmp_path)]
    done = subprocess.run(
        [*cmd, *build.multiarch_include(), "-c", str(build.MAIN_SOURCE), "-o", str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
