"""The eBPF program loaded on the switch's ports, and the mirror of a reference-switch
Device (what P4Runtime wrote) into its maps: tables and multicast groups after every
change, counters folded back into the Device before every read."""

from __future__ import annotations

import errno
import logging
import os
import socket
from pathlib import Path

from homagg.ebpf import maps
from homagg.ebpf.build import PROGRAM, XDP_PROGRAM
from homagg.ebpf.libbpf import (
    XDP_FLAGS_DRV_MODE,
    XDP_FLAGS_SKB_MODE,
    BpfError,
    BpfMap,
    BpfObject,
)
from homagg.environment import EBPF_XDP_ENV
from homagg.refswitch.device import Device
from homagg.wire.constants import NUM_DROP_REASONS, NUM_EVENTS, NUM_SLOT_COPIES

log = logging.getLogger(__name__)
PERCPU_MAPS = ("job_packets", "worker_packets", *maps.COUNTER_MAPS.values())
ZERO_COUNT = maps.COUNT.pack(0, 0)
COUNTER_CELLS = {"ingress_drops": NUM_DROP_REASONS, "egress_drops": NUM_DROP_REASONS}
COUNTER_CELLS["event_counter"] = NUM_EVENTS
XDP_MODES = {"native": XDP_FLAGS_DRV_MODE, "generic": XDP_FLAGS_SKB_MODE, "off": 0}


def xdp_mode() -> str:
    """The XDP stage's mode from HOMAGG_EBPF_XDP (docs/ebpf.md): off (the default: on veth
    ports the stage measured 0.75x the TC program alone with 4 senders), native or generic;
    ValueError for anything else."""
    mode = os.environ.get(EBPF_XDP_ENV, "off") or "off"
    if mode not in XDP_MODES:
        raise ValueError(f"{EBPF_XDP_ENV}={mode!r}: expected one of {', '.join(XDP_MODES)}")
    return mode


def attach_xdp_stage(obj: BpfObject, ifindex: int, iface: str, mode: str) -> str:
    """Attach the XDP stage to one port in `mode`; a driver without native XDP gets the
    generic mode (logged). Returns the mode attached ("off": none)."""
    if mode == "off":
        return mode
    try:
        obj.attach_xdp(XDP_PROGRAM, ifindex, XDP_MODES[mode])
        return mode
    except BpfError as exc:
        if mode != "native" or exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
    log.warning("%s has no native XDP: the XDP stage runs in generic mode there", iface)
    obj.attach_xdp(XDP_PROGRAM, ifindex, XDP_FLAGS_SKB_MODE)
    return "generic"


class KernelDataPlane:
    """The program of `obj_path` on the TC ingress of every port (PORT -> interface name in
    the current network namespace), with its XDP stage in front in `mode` (xdp_mode()); the
    DeviceObserver of the P4Runtime server."""

    def __init__(
        self, obj_path: Path, ports: dict[int, str], device: Device, mode: str = "native"
    ) -> None:
        self.device = device
        self.obj = BpfObject(obj_path)
        self.xdp_modes: dict[str, str] = {}
        try:
            self.maps = {
                name: self.obj.map(name, percpu=name in PERCPU_MAPS)
                for name in (*maps.SIZES, "slots")
            }
            self._check_sizes()
            for port, iface in ports.items():
                ifindex = socket.if_nametoindex(iface)
                self.maps["port_ifindex"].update(maps.U32.pack(port), maps.U32.pack(ifindex))
                self.maps["ifindex_port"].update(maps.U32.pack(ifindex), maps.U32.pack(port))
                self.obj.attach_tc_ingress(PROGRAM, ifindex)
                self.xdp_modes[iface] = attach_xdp_stage(self.obj, ifindex, iface, mode)
        except BaseException:
            self.obj.close()
            raise
        self._generation = -1
        self._installed: dict[str, dict[bytes, bytes]] = {}
        self._last: dict[tuple[str, bytes], tuple[int, int]] = {}

    def _check_sizes(self) -> None:
        for name, (key_size, value_size) in maps.SIZES.items():
            m = self.maps[name]
            if (m.key_size, m.value_size) != (key_size, value_size):
                raise RuntimeError(
                    f"map {name}: the object has key/value {m.key_size}/{m.value_size} bytes, "
                    f"homagg/ebpf/maps.py expects {key_size}/{value_size}"
                )

    def changed(self) -> None:
        """Mirror the Device's tables and groups (a new pipeline resets the maps first)."""
        device = self.device
        running = self.maps["pipeline"]
        if device.config_generation != self._generation:
            running.update(maps.U32.pack(0), maps.U32.pack(0))
            self._reset()
            self._generation = device.config_generation
        if device.p4info is None:
            return
        for table, (map_name, counter_map) in maps.TABLE_MAPS.items():
            entries = device.table(table).entries()
            wanted = {maps.entry_key(table, e): maps.entry_value(table, e) for e in entries}
            self._apply(map_name, wanted, counter_map)
        groups = {}
        for group, replicas in device.multicast_groups.items():
            if len(replicas) > maps.MAX_REPLICAS:
                log.warning(
                    "multicast group %d: %d replicas, the program replicates to the first %d",
                    group,
                    len(replicas),
                    maps.MAX_REPLICAS,
                )
            groups[maps.U32.pack(group)] = maps.group_value(replicas)
        self._apply("multicast_groups", groups, None)
        running.update(maps.U32.pack(0), maps.U32.pack(1))

    def _apply(self, map_name: str, wanted: dict[bytes, bytes], counter_map: str | None) -> None:
        """Make one map hold `wanted`, touching only what differs; a table's direct counter
        starts at zero with its entry and goes with it."""
        installed = self._installed.setdefault(map_name, {})
        bpf_map = self.maps[map_name]
        for key in [k for k in installed if k not in wanted]:
            bpf_map.delete(key)
            del installed[key]
            if counter_map is not None:
                self.maps[counter_map].delete(key)
                self._last.pop((counter_map, key), None)
        for key, value in wanted.items():
            if installed.get(key) == value:
                continue
            if counter_map is not None and key not in installed:
                self.maps[counter_map].update(key, ZERO_COUNT)
                self._last[(counter_map, key)] = (0, 0)
            bpf_map.update(key, value)
            installed[key] = value

    def _reset(self) -> None:
        """Empty every table and group, zero the counters and every slot copy."""
        for table_map, counter_map in maps.TABLE_MAPS.values():
            _clear(self.maps[table_map])
            if counter_map is not None:
                _clear(self.maps[counter_map])
        _clear(self.maps["multicast_groups"])
        for name in maps.COUNTER_MAPS.values():
            counter = self.maps[name]
            for index in range(COUNTER_CELLS[name]):
                counter.update(maps.U32.pack(index), ZERO_COUNT)
        slots = self.maps["slots"]
        empty = bytes(slots.value_size)
        for index in range(NUM_SLOT_COPIES):
            slots.update(maps.U32.pack(index), empty)
        self._installed.clear()
        self._last.clear()

    def refresh(self) -> None:
        """Add what the program counted since the last refresh to the Device's counters."""
        device = self.device
        if device.p4info is None or device.config_generation != self._generation:
            return
        for counter_name, map_name in maps.COUNTER_MAPS.items():
            counter = device.counter(counter_name)
            for index in range(counter.size):
                packets, nbytes = self._delta(map_name, maps.U32.pack(index))
                if packets or nbytes:
                    counter.add(index, packets, nbytes)
        for table, (_, counter_map) in maps.TABLE_MAPS.items():
            if counter_map is None:
                continue
            for entry in device.table(table).entries():
                packets, nbytes = self._delta(counter_map, maps.entry_key(table, entry))
                entry.packets += packets
                entry.bytes += nbytes

    def _delta(self, map_name: str, key: bytes) -> tuple[int, int]:
        per_cpu = self.maps[map_name].lookup(key)
        if per_cpu is None:
            return 0, 0
        now = maps.sum_counts(per_cpu)
        last = self._last.get((map_name, key), (0, 0))
        self._last[(map_name, key)] = now
        return now[0] - last[0], now[1] - last[1]

    def close(self) -> None:
        """Detach the program from every port and unload it."""
        self.obj.close()


def _clear(bpf_map: BpfMap) -> None:
    for key in bpf_map.all_keys():
        bpf_map.delete(key)
