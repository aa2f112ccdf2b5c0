"""The few libbpf calls the eBPF target needs, through ctypes (libbpf.so.1 from Debian's
libbpf): open and load an object, find its maps and program, read and write map
elements, and attach the program to an interface's TC ingress by a BPF link (tcx), so
that it detaches when the switch process ends, however it ends."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Iterator
from pathlib import Path

BPF_XDP = 37  # enum bpf_attach_type
BPF_TCX_INGRESS = 46  # ... Linux >= 6.6
XDP_FLAGS_SKB_MODE = 1 << 1  # generic XDP: after the kernel built the socket buffer
XDP_FLAGS_DRV_MODE = 1 << 2  # native XDP: in the driver (veth: before a socket buffer)
BPF_ANY = 0
BPF_NOEXIST = 1


class LinkCreateOpts(ctypes.Structure):
    """The head of libbpf's struct bpf_link_create_opts (sz, flags): libbpf reads the
    fields after it as zero."""

    _fields_ = [("sz", ctypes.c_size_t), ("flags", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class BpfError(OSError):
    """A libbpf call failed; errno and the call's name say why."""


def _load_library() -> ctypes.CDLL:
    name = ctypes.util.find_library("bpf") or "libbpf.so.1"
    lib = ctypes.CDLL(name, use_errno=True)
    vp, i, u32, u64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64
    signatures = {
        "bpf_object__open_file": (vp, [ctypes.c_char_p, vp]),
        "bpf_object__load": (i, [vp]),
        "bpf_object__close": (None, [vp]),
        "bpf_object__find_map_by_name": (vp, [vp, ctypes.c_char_p]),
        "bpf_object__find_program_by_name": (vp, [vp, ctypes.c_char_p]),
        "bpf_map__fd": (i, [vp]),
        "bpf_map__value_size": (u32, [vp]),
        "bpf_map__key_size": (u32, [vp]),
        "bpf_program__fd": (i, [vp]),
        "bpf_map_update_elem": (i, [i, vp, vp, u64]),
        "bpf_map_lookup_elem": (i, [i, vp, vp]),
        "bpf_map_delete_elem": (i, [i, vp]),
        "bpf_map_get_next_key": (i, [i, vp, vp]),
        "bpf_link_create": (i, [i, i, i, vp]),
        "libbpf_num_possible_cpus": (i, []),
    }
    for fn, (restype, argtypes) in signatures.items():
        getattr(lib, fn).restype = restype
        getattr(lib, fn).argtypes = argtypes
    return lib


_lib: ctypes.CDLL | None = None


def lib() -> ctypes.CDLL:
    """libbpf, loaded on first use (OSError when it is not installed)."""
    global _lib
    if _lib is None:
        _lib = _load_library()
    return _lib


def _check(result: int, what: str) -> int:
    if result < 0:
        err = -result if result != -1 else ctypes.get_errno()
        raise BpfError(err, f"{what}: {os.strerror(err)}")
    return result


class BpfMap:
    """One map of a loaded object: keys and values are bytes of the C structs' layout."""

    def __init__(self, name: str, fd: int, key_size: int, value_size: int, percpu: bool) -> None:
        self.name, self.fd = name, fd
        self.key_size, self.value_size = key_size, value_size
        cpus = _check(lib().libbpf_num_possible_cpus(), "libbpf_num_possible_cpus")
        # a per-CPU map's value is one 8-byte aligned copy per possible CPU
        self.cpus = cpus if percpu else 1
        self.stride = (value_size + 7) // 8 * 8 if percpu else value_size

    def update(self, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
        """Write one element (a per-CPU map: the same value on every CPU)."""
        if self.cpus > 1:
            value = value.ljust(self.stride, b"\0") * self.cpus
        kb, vb = ctypes.create_string_buffer(key), ctypes.create_string_buffer(value)
        _check(lib().bpf_map_update_elem(self.fd, kb, vb, flags), f"update {self.name}")

    def lookup(self, key: bytes) -> list[bytes] | None:
        """The element's value (one per CPU for a per-CPU map), None when absent."""
        kb = ctypes.create_string_buffer(key)
        vb = ctypes.create_string_buffer(self.stride * self.cpus)
        if lib().bpf_map_lookup_elem(self.fd, kb, vb) < 0:
            return None
        raw = vb.raw
        return [raw[c * self.stride : c * self.stride + self.value_size] for c in range(self.cpus)]

    def delete(self, key: bytes) -> None:
        """Remove one element; an absent one is not an error."""
        lib().bpf_map_delete_elem(self.fd, ctypes.create_string_buffer(key))

    def all_keys(self) -> Iterator[bytes]:
        """Every key of a hash map (a snapshot: deleting while iterating is fine)."""
        found = []
        nxt = ctypes.create_string_buffer(self.key_size)
        prev = None
        while lib().bpf_map_get_next_key(self.fd, prev, nxt) == 0:
            found.append(nxt.raw)
            prev = ctypes.create_string_buffer(nxt.raw)
        return iter(found)


class BpfObject:
    """A BPF ELF object opened and loaded into the kernel (the verifier runs here)."""

    def __init__(self, path: Path) -> None:
        obj = lib().bpf_object__open_file(str(path).encode(), None)
        if not obj:
            err = ctypes.get_errno()
            raise BpfError(err, f"open {path}: {os.strerror(err)}")
        self._obj: int | None = obj
        try:
            _check(lib().bpf_object__load(obj), f"load {path.name} (see the verifier log above)")
        except BpfError:
            self.close()
            raise
        self._links: list[int] = []

    def map(self, name: str, percpu: bool = False) -> BpfMap:
        """The map named `name` in the C source."""
        m = lib().bpf_object__find_map_by_name(self._obj, name.encode())
        if not m:
            raise KeyError(f"no map {name} in the BPF object")
        fd = _check(lib().bpf_map__fd(m), f"fd of {name}")
        key_size, value_size = lib().bpf_map__key_size(m), lib().bpf_map__value_size(m)
        return BpfMap(name, fd, key_size, value_size, percpu)

    def _program_fd(self, program: str) -> int:
        prog = lib().bpf_object__find_program_by_name(self._obj, program.encode())
        if not prog:
            raise KeyError(f"no program {program} in the BPF object")
        return _check(lib().bpf_program__fd(prog), f"fd of {program}")

    def attach_tc_ingress(self, program: str, ifindex: int) -> None:
        """Attach `program` to the TC ingress of interface `ifindex` with a link owned by
        this process: the kernel detaches it when the process exits."""
        link = lib().bpf_link_create(self._program_fd(program), ifindex, BPF_TCX_INGRESS, None)
        self._links.append(_check(link, f"attach {program} to TC ingress of ifindex {ifindex}"))

    def attach_xdp(self, program: str, ifindex: int, mode_flags: int) -> None:
        """Attach `program` as interface `ifindex`'s XDP program in the mode of `mode_flags`
        (XDP_FLAGS_DRV_MODE or XDP_FLAGS_SKB_MODE), by a link owned by this process."""
        opts = LinkCreateOpts(ctypes.sizeof(LinkCreateOpts), mode_flags, 0)
        fd = self._program_fd(program)
        link = lib().bpf_link_create(fd, ifindex, BPF_XDP, ctypes.byref(opts))
        self._links.append(_check(link, f"attach {program} as XDP of ifindex {ifindex}"))

    def close(self) -> None:
        """Detach every link and unload the object."""
        for link in getattr(self, "_links", []):
            os.close(link)
        self._links = []
        if self._obj:
            lib().bpf_object__close(self._obj)
            self._obj = None


BPF_PROG_TYPE_SCHED_CLS = 3
TCX_KERNEL = (6, 6)  # the first kernel with tcx links (BPF_TCX_INGRESS)


def kernel_problem() -> str:
    """Why this kernel or process cannot run the program ("" when it can): libbpf missing,
    a kernel before tcx links, or the kernel refusing a TC program (no privileges)."""
    release = os.uname().release
    try:
        version = tuple(int(part) for part in release.split("-")[0].split(".")[:2])
    except ValueError:
        version = (0, 0)
    if version < TCX_KERNEL:
        return f"kernel {release} is older than 6.6 (no tcx links for TC programs)"
    try:
        probe = lib().libbpf_probe_bpf_prog_type
    except OSError as exc:
        return f"libbpf is not installed: {exc}"
    probe.restype, probe.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_void_p]
    if probe(BPF_PROG_TYPE_SCHED_CLS, None) != 1:
        return "the kernel refuses BPF TC programs here (root, or CAP_BPF and CAP_NET_ADMIN)"
    return ""
