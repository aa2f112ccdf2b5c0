"""The "homagg" torch.distributed backend: `dist.init_process_group("homagg")` and every
`all_reduce` that the switch can do exactly goes through it, with the codec for float sums
and plain ADD or MAX phases for integers and float maxima; every other collective, every
other dtype or op and every failure goes to a gloo process group the backend owns, decided
by all ranks together with the DDP hook's rules (worker/ddp_hook.py: SwitchHookState).

    import worker.backend  # registers "homagg"
    dist.init_process_group("homagg")   # HOMAGG_CONTROLLER, torchrun's RANK/WORLD_SIZE

The job is set up at init as `homagg.attach` does it (worker/attach.py), its id and token
shared through the process group's store. Each all_reduce counts as one step of the
hook's cool-down."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Generator
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from aggwire.constants import Op
from worker.attach import ENV_CODEC, connect
from worker.codecs import CorruptResultError, Phase
from worker.ddp_hook import CODEC_FAILED, OK, SwitchHookState, _through_switch

BACKEND_NAME = "homagg"
_JOB_KEY = "homagg/job"
_SUM_OPS = (dist.ReduceOp.SUM, dist.ReduceOp.AVG)
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)  # exact in float32
_INTS = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
_INT32_MAX = 2**31 - 1
# Collectives the backend hands to gloo unchanged.
DELEGATED = (
    "broadcast",
    "allgather",
    "_allgather_base",
    "allgather_coalesced",
    "allgather_into_tensor_coalesced",
    "allreduce_coalesced",
    "reduce",
    "gather",
    "scatter",
    "reduce_scatter",
    "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced",
    "alltoall",
    "alltoall_base",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
    "recv_anysource",
)


def store_exchange(store: dist.Store, rank: int, timeout: timedelta) -> Callable[[Any], Any]:
    """Rank 0's value to every rank through the store (the job ticket, or rank 0's reason)."""

    def exchange(value: Any) -> Any:
        if rank == 0:
            store.set(_JOB_KEY, pickle.dumps(value))
            return value
        store.wait([_JOB_KEY], timeout)
        return pickle.loads(store.get(_JOB_KEY))

    return exchange


def float_order_key(x: np.ndarray) -> np.ndarray:
    """float32 -> int32 with the same order (negative floats' magnitude bits flipped), so
    the switch's integer MAX of keys is the key of the float maximum."""
    bits = np.ascontiguousarray(x, np.float32).view(np.int32)
    return np.where(bits < 0, bits ^ np.int32(_INT32_MAX), bits)


def float_from_key(key: np.ndarray) -> np.ndarray:
    """The inverse of float_order_key."""
    key = np.asarray(key, np.int32)
    return np.where(key < 0, key ^ np.int32(_INT32_MAX), key).view(np.float32)


def switch_kind(t: torch.Tensor, op: Any) -> str:
    """What the switch does with this all_reduce: "codec" (float sums), "add" or "max" (raw
    int32 phases) or "" (gloo)."""
    if t.is_sparse or t.device.type != "cpu" or t.numel() == 0:
        return ""
    if t.dtype in _FLOATS:
        return "codec" if op in _SUM_OPS else "max" if op == dist.ReduceOp.MAX else ""
    if t.dtype in _INTS:
        return "add" if op == dist.ReduceOp.SUM else "max" if op == dist.ReduceOp.MAX else ""
    return ""


class _State(SwitchHookState):
    """The hook's decision state, its MAX agreement through the backend's gloo group."""

    def __init__(self, gloo: dist.ProcessGroup, **kw: Any) -> None:
        super().__init__(**kw)
        self.gloo = gloo

    def reduce_max(self, t: torch.Tensor) -> None:
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX
        self.gloo.allreduce([t], opts).wait()


def _done(tensors: list[torch.Tensor]) -> Any:
    fut: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
    fut.set_result(tensors)
    return _create_work_from_future(fut)


class SwitchProcessGroup(dist.ProcessGroup):
    """A process group whose all_reduce goes through the switch where it can (see module)."""

    def __init__(self, store: dist.Store, rank: int, world: int, timeout: timedelta) -> None:
        super().__init__(rank, world)
        self.gloo = dist.ProcessGroupGloo(dist.PrefixStore("homagg/gloo", store), rank, world)
        codec = os.environ.get(ENV_CODEC, "lossless")
        exchange = store_exchange(dist.PrefixStore("homagg", store), rank, timeout)
        agent, reason = connect(codec, ranks=(rank, world, exchange))
        self.state = _State(
            self.gloo,
            agent=agent,
            codec=codec,
            world_size=world,
            rank=rank,
            unavailable_reason=reason,
        )

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        """The name it is registered under."""
        return BACKEND_NAME

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """One tensor through the switch when switch_kind allows and every rank agrees."""
        opts = opts if opts is not None else dist.AllreduceOptions()
        kind = switch_kind(tensors[0], opts.reduceOp) if len(tensors) == 1 else ""
        st = self.state
        if not kind or not st.use_switch():
            st.end_step()
            return self._gloo_allreduce(tensors, opts)
        t = tensors[0]
        out, failure, reason = self._through_switch(t, kind)
        failed, health, chunk = st.agree(failure, st.local_health())
        if failed != OK:
            st.fall_back(failed, reason, chunk)
            st.end_step()
            return self._gloo_allreduce(tensors, opts)
        assert out is not None
        t.copy_(torch.from_numpy(out).reshape(t.shape))
        if opts.reduceOp == dist.ReduceOp.AVG:
            t.div_(self.size())
        st.stats.switch_buckets += 1
        if health != OK:
            st.fall_back(health, st.local_reason(), chunk)
        st.end_step()
        return _done(tensors)

    def _through_switch(self, t: torch.Tensor, kind: str) -> tuple[np.ndarray | None, int, str]:
        st = self.state
        if kind == "codec":
            flat = t.detach().reshape(-1).to(torch.float32).numpy()
            return _through_switch(st, flat.size, flat, flat.size)  # one codec per size
        x = t.detach().reshape(-1)
        if t.dtype in _FLOATS:
            cells = float_order_key(x.to(torch.float32).numpy())
        else:
            cells = x.to(torch.int64).numpy()
            bound = _INT32_MAX // self.size() if kind == "add" else _INT32_MAX
            big = cells.size and int(np.abs(cells).max()) > bound
            # Agreed before any packet: one rank's out-of-range values send every rank to gloo.
            failed, _, _ = st.agree(CODEC_FAILED if big else OK, OK)
            if failed != OK:
                return None, CODEC_FAILED, f"integers beyond the int32 cells' range (|x| > {bound})"
            cells = cells.astype(np.int32)
        op = Op.ADD if kind == "add" else Op.MAX
        out, failure, reason = _through_switch(st, 0, cells, cells.size, _raw_phase(op, cells))
        if out is not None and t.dtype in _FLOATS:
            out = float_from_key(out)
        return out, failure, reason

    def _gloo_allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        if opts.reduceOp != dist.ReduceOp.AVG:
            return self.gloo.allreduce(tensors, opts)
        total = dist.AllreduceOptions()  # gloo has no AVG: SUM, then divide
        total.reduceOp = dist.ReduceOp.SUM
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
        return getattr(self.gloo, name)(*args, **kwargs)

    call.__name__ = name
    call.__doc__ = f"gloo's {name}."
    return call


for _name in DELEGATED:
    setattr(SwitchProcessGroup, _name, _delegate(_name))


def _create(store: dist.Store, rank: int, world: int, timeout: timedelta) -> SwitchProcessGroup:
    return SwitchProcessGroup(store, rank, world, timeout)


def register() -> None:
    """Register the backend under BACKEND_NAME (idempotent)."""
    if BACKEND_NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu"])


register()
