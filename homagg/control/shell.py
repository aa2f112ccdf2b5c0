"""`aggctl shell`: an interactive Python prompt holding a P4Runtime session with one switch.

p4runtime-shell would be the usual tool, but it pins protobuf<3.21 and p4runtime==1.4.1,
which cannot share a virtual environment with the protobuf and regenerated P4Runtime
modules that grpcio needs here, and it keeps its client in a module global. This shell
offers the same kind of access through the project's own SwitchConnection."""

from __future__ import annotations

import code
from typing import Any

from homagg.control.artifacts import BMV2_JSON_PATH, P4INFO_PATH
from homagg.control.switch_connection import SwitchConnection
from homagg.p4rt.p4info import P4InfoIndex
from homagg.wire import p4names
from homagg.wire.constants import DropReason, Event

BANNER = (
    "homagg P4Runtime shell on {address} (device {device_id}, election id {election_id}, {role})\n"
    """  conn       the SwitchConnection: conn.read_entries(table), conn.read_counter(name),
             conn.read_multicast_groups(), conn.insert_entry(...), conn.set_pipeline(...)
  p4info     the committed program's P4InfoIndex (p4info.tables, p4info.counters)
  p4names    object names (p4names.JOB_TABLE, p4names.INGRESS_DROPS, ...)
  entries(t) the entries of table t          drops()  ingress drops by reason
  push()     push the committed pipeline (resets every slot and entry: primary only)
{warning}Ctrl-D leaves (the switch keeps its state)."""
)


def namespace(conn: SwitchConnection) -> dict[str, Any]:
    """The names the shell starts with."""

    def entries(table: str) -> list[Any]:
        return conn.read_entries(table)

    def drops() -> dict[str, int]:
        return {
            DropReason(i).name if i in DropReason._value2member_map_ else str(i): pk
            for i, (pk, _) in conn.read_counter(p4names.INGRESS_DROPS).items()
            if pk
        }

    def push() -> None:
        conn.set_pipeline(P4INFO_PATH, BMV2_JSON_PATH)

    return {
        "conn": conn,
        "p4info": P4InfoIndex.from_text_file(P4INFO_PATH),
        "p4names": p4names,
        "DropReason": DropReason,
        "Event": Event,
        "entries": entries,
        "drops": drops,
        "push": push,
    }


PRIMARY_WARNING = (
    "  NOTE: this shell is primary. A controller managing this switch is now a backup: it\n"
    "  writes nothing and its jobs wait until you leave; it then reads the switch back and\n"
    "  undoes what you changed. Use an election id below the controller's to only look.\n"
)


def run_shell(address: str, device_id: int = 0, election_id: int = 1, timeout: float = 5.0) -> None:
    """Connect (as a backup when another client is primary) and run the prompt until EOF."""
    conn = SwitchConnection(address, device_id, election_id, timeout)
    conn.connect(require_primary=False)
    try:
        warning = (
            PRIMARY_WARNING
            if conn.is_primary
            else (
                f"  NOTE: a client with election id {conn.primary_election_id} (the controller?) "
                "is primary: reads work, writes are refused.\n"
            )
        )
        banner = BANNER.format(
            address=address,
            device_id=device_id,
            election_id=election_id,
            role="primary" if conn.is_primary else "backup",
            warning=warning,
        )
        code.interact(banner=banner, local=namespace(conn), exitmsg="")
    finally:
        conn.close()
