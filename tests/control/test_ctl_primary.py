"""Losing P4Runtime primary: another client with a higher election id takes over, deletes an
entry and leaves. The controller notices (arbitration update), says so in Status, writes
nothing and claims no success meanwhile (a release answers UNAVAILABLE and changes nothing,
a completed job waits), and once primary again reads the switch back and repairs it."""

from __future__ import annotations

import grpc
from ctl_helpers import HOSTS, job_state, join_all, make_config, rpc_code

from homagg.control.switch_connection import SwitchConnection
from homagg.lab.poll import wait_for
from homagg.wire import p4names


def _status(ctl):
    return ctl.client.status().switches[0]


def test_lost_primary_is_noticed_refused_and_repaired(switch, tmp_path, start_controller, reader):
    ctl = start_controller(make_config(switch.address, tmp_path, lease=30.0, join_timeout=60.0))
    c = ctl.client
    kept = c.create_job("kept", 2, "dense", pool_size=4)
    join_all(c, kept, HOSTS[:2], udp_base=41000)
    released = c.create_job("released", 1, "dense", pool_size=4)
    join_all(c, released, HOSTS[2:3], udp_base=42000)
    assert _status(ctl).role == "primary"
    before = job_state(reader())
    assert set(before["jobs"]) == {kept.job_id, released.job_id}

    intruder = SwitchConnection(switch.address, election_id=20, timeout=3.0)
    intruder.connect()
    try:
        wait_for(lambda: "not primary" in _status(ctl).last_error, 5.0, "the controller to notice")
        st = _status(ctl)
        assert st.role.startswith("backup") and "election id 20" in st.role
        assert "not primary" in st.last_error
        [entry] = [
            e
            for e in intruder.read_entries(p4names.WORKER_TABLE)
            if e.match["hdr.agg.job_id"] == kept.job_id and e.match["hdr.agg.rank"] == 1
        ]
        intruder.delete_entry(p4names.WORKER_TABLE, entry.match, entry.priority)

        code, details = rpc_code(lambda: c.release(released.job_id))
        assert code == grpc.StatusCode.UNAVAILABLE and "not primary" in details
        assert released.job_id in {j.job_id for j in c.list_jobs().jobs}
        assert released.job_id in job_state(reader())["jobs"]

        late = c.create_job("late", 1, "dense", pool_size=4)
        join_all(c, late, HOSTS[3:4], udp_base=43000)
        code, details = rpc_code(lambda: c.wait_ready(late.job_id, late.token, 0, timeout_s=0.5))
        assert code == grpc.StatusCode.UNAVAILABLE and "not primary" in details
        states = {j.job_id: j.state for j in c.list_jobs().jobs}
        assert states == {
            kept.job_id: "installing",
            released.job_id: "installing",
            late.job_id: "installing",
        }
    finally:
        intruder.close()

    ctl.wait_synced()
    assert _status(ctl).role == "primary" and _status(ctl).last_error == ""
    after = job_state(reader())
    assert (kept.job_id, 1) in after["workers"]  # read back and repaired
    assert set(after["jobs"]) == {kept.job_id, released.job_id, late.job_id}
    assert c.wait_ready(late.job_id, late.token, 0, timeout_s=5).job_id == late.job_id
    c.release(released.job_id)
    assert released.job_id not in job_state(reader())["jobs"]
