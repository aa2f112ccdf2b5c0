"""The "homagg" torch.distributed backend: after `dist.init_process_group("homagg")` every
`all_reduce` the switch can do goes through it: float SUM/AVG with the codec (within its
fixed-point bound), integer SUM/MAX exactly as int32 ADD/MAX phases, float MAX exactly as
MAX of order-preserving int32 keys. Every other collective, dtype or op, and every failure,
goes to a gloo process group the backend owns; the switch-or-gloo decision is the DDP
hook's (homagg/worker/ddp/fallback.py, through SwitchHookState), made by all ranks together.

    import homagg                        # registers "homagg"
    dist.init_process_group("homagg")    # HOMAGG_CONTROLLER, torchrun's RANK/WORLD_SIZE

The job is set up at init as `homagg.attach` does it (homagg/worker/ddp/attach.py), its id and token
shared through the process group's store, and left (released by rank 0) when the group is
destroyed or the process exits. Each all_reduce counts as one step of the hook's cool-down.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]

from homagg import BACKEND_NAME, register_backend
from homagg.wire.constants import Op
from homagg.worker.codecs import DEFAULT_CODEC, CorruptResultError, Phase
from homagg.worker.ddp import sparse_bucket
from homagg.worker.ddp.gathered_max import start_max_over
from homagg.worker.ddp.hook import SwitchHookState
from homagg.worker.ddp.metrics import expose, local_rank, metrics_request
from homagg.worker.ddp.switch_path import Gradient, RawPhases, Via, agreed_sum
from homagg.worker.job.setup import Members, Request, set_up

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)  # exact in float32
_INTS = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
_INT32_MAX = 2**31 - 1
_QUIET_NAN = np.int32(0x7FC00000)  # float32 NaN's bits, sign clear


# Every collective of torch's ProcessGroup but allreduce: handed to gloo unchanged, through a
# plain ProcessGroup over the same gloo backend (it has every name torch's functions call,
# the newer all_gather_single and reduce_scatter_single among them). Not left to the
# ProcessGroup base class: through this Python subclass its call into gloo can wait for a
# lock that a gloo thread holds while it waits for the GIL (a hang, seen).
DELEGATED = (
    "_allgather_base",
    "_reduce_scatter_base",
    "all_gather_single",
    "all_gather_single_coalesced",
    "all_to_all_single",
    "allgather",
    "allgather_coalesced",
    "allgather_into_tensor_coalesced",
    "allreduce_coalesced",
    "alltoall",
    "alltoall_base",
    "barrier",
    "broadcast",
    "gather",
    "monitored_barrier",
    "recv",
    "recv_anysource",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor_coalesced",
    "scatter",
    "send",
)


def _plain_group(gloo: Any, store: dist.Store, rank: int, world_size: int) -> Any:
    """A ProcessGroup of torch's own whose CPU backend is `gloo` (as init_process_group
    builds one), for the collectives the backend hands over."""
    pg = dist.ProcessGroup(dist.PrefixStore("homagg/plain", store), rank, world_size)
    pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
    return pg


def float_order_key(x: np.ndarray) -> np.ndarray:
    """float32 -> int32 with the same order (negative floats' magnitude bits flipped), so
    the switch's integer MAX of keys is the key of the float maximum. Every NaN becomes
    the positive quiet NaN, above +inf: one rank's NaN makes the maximum NaN, as torch.max."""
    x = np.ascontiguousarray(x, np.float32)
    bits = np.where(np.isnan(x), _QUIET_NAN, x.view(np.int32))
    return np.where(bits < 0, bits ^ np.int32(_INT32_MAX), bits).astype(np.int32)


def float_from_key(key: np.ndarray) -> np.ndarray:
    """The inverse of float_order_key."""
    key = np.asarray(key, np.int32)
    return np.where(key < 0, key ^ np.int32(_INT32_MAX), key).view(np.float32)


def _sums(op: Any) -> bool:
    # `==`, not `in`: the options' ReduceOp equals the RedOpType members, a tuple lookup not.
    return bool(op == dist.ReduceOp.SUM or op == dist.ReduceOp.AVG)


def switch_kind(t: torch.Tensor, op: Any) -> str:
    """What the switch does with this all_reduce: "codec" (float sums, dense or sparse COO),
    "add" or "max" (raw int32 phases) or "" (gloo)."""
    if t.device.type != "cpu" or t.numel() == 0:
        return ""
    if t.is_sparse:
        return "codec" if t.dtype in _FLOATS and _sums(op) else ""
    if t.dtype in _FLOATS:
        return "codec" if _sums(op) else "max" if op == dist.ReduceOp.MAX else ""
    if t.dtype in _INTS:
        return "add" if op == dist.ReduceOp.SUM else "max" if op == dist.ReduceOp.MAX else ""
    return ""


class _State(SwitchHookState):
    """The hook's decision state, its MAX agreement through the backend's gloo group."""

    def __init__(self, gloo: Any, **kw: Any) -> None:
        super().__init__(**kw)
        self.gloo = gloo

    def reduce_max_async(self, t: torch.Tensor) -> Any:
        return start_max_over(self.gloo, t)


def _done(tensors: list[torch.Tensor]) -> Any:
    fut: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
    fut.set_result(tensors)
    return _create_work_from_future(fut)


# The backend runs the registered codecs only: "auto" budgets from DDP's bucket timing.
_NO_AUTO = " (codec 'auto' works with homagg.attach's hook only)"


class SwitchProcessGroup(dist.ProcessGroup):
    """A process group whose all_reduce goes through the switch where it can (see module)."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, timeout: timedelta) -> None:
        super().__init__(rank, world_size)  # type: ignore[call-arg]  # torch's Python-PG form
        self.gloo: Any = dist.ProcessGroupGloo(  # Any: its stub lacks the collectives
            dist.PrefixStore("homagg/gloo", store), rank, world_size, timeout
        )
        self.plain = _plain_group(self.gloo, store, rank, world_size)
        self.gloo_calls: Counter[str] = Counter()  # all_reduces sent to gloo, by reason
        request = Request(refusal_note=_NO_AUTO)
        metrics = metrics_request(None, None)  # $HOMAGG_METRICS_PORT: a bad one fails here
        self.setup = set_up(request, Members(store, rank, world_size))
        self.state = _State(
            self.gloo,
            agent=self.setup.agent,
            codec=self.setup.codec or DEFAULT_CODEC,
            world_size=world_size,
            rank=rank,
            unavailable_reason=self.setup.reason,
        )
        self.state.warned = bool(self.setup.reason)  # set_up warned once already
        if self.setup.session is not None:
            self.setup.session.states.append(self.state)
        if metrics is not None:
            self.state.metrics = expose(self.state, metrics, local_rank())

    def getBackendName(self) -> str:
        """The name it is registered under."""
        return BACKEND_NAME

    def shutdown(self) -> None:
        """Read the last call's seal, leave the job (rank 0 releases it) and shut gloo
        down: destroy_process_group."""
        self.state.close()
        if self.setup.session is not None:
            self.setup.session.close()
        self.state.agent = None
        self.state.unavailable_reason = "the process group was destroyed"
        self.plain.shutdown()  # now, not in the interpreter's teardown
        self.gloo.shutdown()

    def allreduce(  # type: ignore[override]  # the form c10d calls on a Python group
        self, tensors: list[torch.Tensor], opts: Any = None
    ) -> Any:
        """One tensor through the switch when switch_kind allows and every rank agrees,
        else gloo's all_reduce; each call is one step of the hook's cool-down."""
        opts = opts if opts is not None else dist.AllreduceOptions()
        op = opts.reduceOp
        if op == dist.ReduceOp.AVG and any(not t.is_floating_point() for t in tensors):
            raise ValueError("all_reduce AVG needs floating-point tensors; use SUM for integers")
        kind = switch_kind(tensors[0], op) if len(tensors) == 1 else ""
        out, why = self._switch_sum(tensors[0], kind)
        self.state.end_step()
        if out is None:
            return self._gloo_allreduce(tensors, opts, why)
        t = tensors[0]
        with torch.no_grad():  # as gloo writes: a leaf that requires grad is written too
            t.copy_(out)  # in place, as gloo does (sparse too)
        if op == dist.ReduceOp.AVG:
            t.div_(self.size())
        return _done(tensors)

    def _switch_sum(self, t: torch.Tensor, kind: str) -> tuple[torch.Tensor | None, str]:
        """(the switch's result, shaped as `t`, "") or (None, why this call goes to gloo);
        the same on every rank, as each decision is agreed."""
        if not kind:
            return None, "not a switch operation"
        if not self.state.use_switch():
            return None, "fallback"
        if t.is_sparse:  # its rows, never densified; the rows' union as gloo's
            sparse = sparse_bucket.SparseBucket(t)
            out = agreed_sum(self.state, t.numel(), Via(sparse.phases), t.numel())
            return (None, "fallback") if out is None else (sparse.result(out), "")
        cells = self._cells(t, kind)
        if cells is None:
            return None, "integers beyond the int32 cells"
        if kind == "codec":  # a codec per tensor size, the key of any error memory
            out = agreed_sum(self.state, t.numel(), Gradient(cells), t.numel())
        else:
            phase = _raw_phase(Op.ADD if kind == "add" else Op.MAX, cells)
            out = agreed_sum(self.state, 0, RawPhases(phase), cells.size)
        if out is None:
            return None, "fallback"
        if t.is_floating_point() and kind == "max":
            out = float_from_key(out)
        return torch.from_numpy(np.asarray(out)).reshape(t.shape), ""

    def _cells(self, t: torch.Tensor, kind: str) -> np.ndarray | None:
        """The codec's float32 input or int32 cells for ADD/MAX; None when some rank's
        integers do not fit (agreed: every rank then takes gloo)."""
        x = t.detach().reshape(-1)
        if kind == "codec":
            return x.to(torch.float32).numpy()
        if t.is_floating_point():
            return float_order_key(x.to(torch.float32).numpy())
        wide = x.to(torch.int64).numpy()
        # ADD: no partial sum of `world_size` values within the bound leaves int32 (no wrap).
        bound = _INT32_MAX // self.size() if kind == "add" else _INT32_MAX
        out_of_range = int(wide.max()) > bound or int(wide.min()) < -bound
        big = torch.tensor([int(out_of_range)], dtype=torch.int64)
        self.state.reduce_max(big)  # one rank's out-of-range values send every rank to gloo
        self.state.stats.agreements += 1
        return None if bool(big) else wide.astype(np.int32)

    def _gloo_allreduce(self, tensors: list[torch.Tensor], opts: Any, why: str) -> Any:
        self.gloo_calls[why] += 1
        if why == "fallback":
            self.state.stats.fallback_buckets += 1
        if opts.reduceOp != dist.ReduceOp.AVG:
            return self.gloo.allreduce(tensors, opts)
        total = dist.AllreduceOptions()  # gloo has no AVG: SUM, then divide
        total.reduceOp = dist.ReduceOp(dist.ReduceOp.SUM)
        self.gloo.allreduce(tensors, total).wait()
        for t in tensors:
            t.div_(self.size())
        return _done(tensors)


def _raw_phase(op: Op, cells: np.ndarray) -> Generator[Phase, np.ndarray, np.ndarray]:
    """One switch phase, its combination returned as it comes (no codec)."""
    result = yield Phase(op, cells)
    if result.size != cells.size:
        raise CorruptResultError(f"{result.size} cells received, {cells.size} sent")
    return np.asarray(result)


def _delegate(name: str) -> Callable[..., Any]:
    def call(self: SwitchProcessGroup, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.plain, name)(*args, **kwargs)

    call.__name__ = name
    call.__doc__ = f"gloo's {name}."
    return call


for _name in DELEGATED:
    setattr(SwitchProcessGroup, _name, _delegate(_name))


def create(store: dist.Store, rank: int, world_size: int, timeout: timedelta) -> SwitchProcessGroup:
    return SwitchProcessGroup(store, rank, world_size, timeout)


def switch_group(group: dist.ProcessGroup | None = None) -> SwitchProcessGroup:
    """The homagg process group behind `group` (default: the world), for its `state.stats`
    and `gloo_calls`; a clear error when the group is not the homagg backend's."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, SwitchProcessGroup):
        raise ValueError(f"the process group is {type(pg).__name__}, not {BACKEND_NAME!r}")
    return pg


register_backend()
