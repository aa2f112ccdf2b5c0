"""`attach(ddp_model)`: put an ordinary torchrun/DDP script on the switch with one added line.

Everything comes from the environment: the controller from HOMAGG_CONTROLLER (or the
`controller=` argument), rank and world size from the process group, the job either from
the launcher (HOMAGG_JOB_ID with HOMAGG_TOKEN_FILE or HOMAGG_TOKEN; its codec is then the
job's) or created by rank 0 with the operator credential of HOMAGG_OPERATOR_TOKEN_FILE or
HOMAGG_OPERATOR_TOKEN and shared through the process group's store (the token is never
logged), the CA that signed the controller's TLS certificate from HOMAGG_CA_FILE (a
controller without TLS only with HOMAGG_INSECURE=1: plaintext is never a silent fallback),
this worker's IP, interface and MAC from the route to the controller (or HOMAGG_IFACE when
the switch is on another interface), and its switch port from the controller's topology.
The ranks set the job up together (homagg/worker/job/setup.py): whatever fails, every rank gets
the same message and the model trains over the process group instead (one warning), never
hangs (docs/worker.md)."""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist

from homagg.environment import ATTACH_ENV
from homagg.worker.auto.control import auto_config
from homagg.worker.codecs import AUTO_CODEC, CODEC_CHOICES, DEFAULT_CODEC
from homagg.worker.ddp.hook import SwitchHookState, switch_allreduce_hook
from homagg.worker.ddp.metrics import expose, local_rank, metrics_request
from homagg.worker.job.setup import Request, Setup, group_members, set_up


def attach(
    model: Any,
    codec: str | None = None,
    *,
    asynchronous: bool = False,
    codec_options: dict[str, Any] | None = None,
    auto_options: dict[str, Any] | None = None,
    controller: str | None = None,
    pool_size: int = 0,
    group: dist.ProcessGroup | None = None,
    name: str = "torchrun",
    metrics_port: int | None = None,
    metrics_address: str | None = None,
) -> SwitchHookState:
    """Aggregate `model`'s (a DistributedDataParallel) gradients through the switch from the
    next step on; returns the hook state (`stats` says what happened, `close()` stops the
    asynchronous hook's thread). Call it on every rank after init_process_group and DDP(...).

    codec: a codec name or "auto" (per bucket and step, homagg/worker/auto/control.py; always
    asynchronous); None: $HOMAGG_CODEC, else the launcher's job's, else DEFAULT_CODEC.
    asynchronous: aggregate on a communication thread while backward goes on.
    codec_options: the codec's options (for "auto": codec name -> options).
    auto_options: the "auto" controller's settings (auto/control.py's AutoConfig fields but
    its codecs, e.g. {"lag": 0}; auto_option_names lists them).
    model None: set up and return the state without registering it (DeAR's
    DearDataParallel takes it). The job ends at destroy_process_group or exit.
    metrics_port: serve the hook's stats to Prometheus on this port + LOCAL_RANK (0: any
    free port; None: $HOMAGG_METRICS_PORT, else none), on metrics_address (default
    $HOMAGG_METRICS_ADDRESS, else 127.0.0.1); `state.metrics.url` (homagg/worker/ddp/metrics.py).
    $HOMAGG_ATTACH=0 (on every rank): nothing is set up or registered, the state says why."""
    if auto_options:
        auto_config(auto_options, lanes=False)  # a bad option fails before the job exists
    metrics = metrics_request(metrics_port, metrics_address)  # so does a bad port
    members = group_members(group)
    if attach_off():  # the same script without the switch (make run's gloo run of --script)
        off = SwitchHookState(
            None,
            codec=codec or DEFAULT_CODEC,
            process_group=group,
            unavailable_reason=f"{ATTACH_ENV}=0",
            rank=members.rank,
            world_size=members.world_size,
        )
        off.warned = True  # chosen, not a failure: no warning
        return off
    setup = set_up(
        Request(
            codec=codec or "",
            also=(AUTO_CODEC,),
            controller=controller or "",
            pool_size=pool_size,
            name=name,
        ),
        members,
    )
    chosen = setup.codec or codec or DEFAULT_CODEC
    if auto_options and chosen != AUTO_CODEC:
        raise ValueError(f"auto_options apply to codec {AUTO_CODEC!r}, not {chosen!r}")
    state = SwitchHookState(
        setup.agent,
        codec=chosen,
        process_group=group,
        unavailable_reason=setup.reason,
        codec_options=codec_options,
        asynchronous=asynchronous,
        rank=members.rank,
        world_size=members.world_size,
        lane_ops=setup.lane_ops,
        auto=auto_config(auto_options or {}, setup.lane_ops) if chosen == AUTO_CODEC else None,
    )
    state.warned = bool(setup.reason)  # set_up warned once already
    if metrics is not None:
        state.metrics = expose(state, metrics, local_rank())
    if setup.session is not None:
        setup.session.states.append(state)
    if model is not None and setup.complete:  # incomplete: a rank issues DDP's own collectives
        model.register_comm_hook(state, switch_allreduce_hook)
    return state


def attach_off() -> bool:
    """Whether $HOMAGG_ATTACH asks attach() to stay off ("0"; unset, "" or "1": on); another
    value is a ValueError naming the variable."""
    value = os.environ.get(ATTACH_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{ATTACH_ENV}={value!r}: expected 0 (off) or 1 (on)")
    return value == "0"


__all__ = ["CODEC_CHOICES", "Setup", "attach", "attach_off"]
