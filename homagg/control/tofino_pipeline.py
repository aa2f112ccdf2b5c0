"""The device configuration a Tofino switch behind Stratum takes in P4Runtime's
SetForwardingPipelineConfig: a `BfPipelineConfig` message (Stratum's bf.proto) packing the
bf-p4c output of p4src/tofino (bfrt.json, and per pipeline its context.json and
tofino.bin). The controller pushes whatever device config file its switch entry names, so
this module only has to produce that file:

    python -m homagg.control.tofino_pipeline <bf-p4c output dir> -o tofino_device_config.pb

The message is declared here from its field numbers (a descriptor built at import), so no
Stratum code or generated module is needed."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

DEFAULT_PIPE_SCOPE = (0, 1, 2, 3)  # every pipe of a Tofino 1 runs the program
_F = descriptor_pb2.FieldDescriptorProto


def _message_class() -> type[Message]:
    """BfPipelineConfig { string p4_name = 1; bytes bfruntime_info = 2;
    repeated Profile profiles = 3; } with Profile { string profile_name = 1;
    bytes context = 2; bytes binary = 3; repeated uint32 pipe_scope = 4; }."""
    f = descriptor_pb2.FileDescriptorProto(
        name="homagg_bf_pipeline.proto", package="stratum.hal.barefoot", syntax="proto3"
    )
    top = f.message_type.add(name="BfPipelineConfig")
    profile = top.nested_type.add(name="Profile")
    for num, name, kind, label in (
        (1, "profile_name", _F.TYPE_STRING, _F.LABEL_OPTIONAL),
        (2, "context", _F.TYPE_BYTES, _F.LABEL_OPTIONAL),
        (3, "binary", _F.TYPE_BYTES, _F.LABEL_OPTIONAL),
        (4, "pipe_scope", _F.TYPE_UINT32, _F.LABEL_REPEATED),
    ):
        profile.field.add(name=name, number=num, type=kind, label=label)
    top.field.add(name="p4_name", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    top.field.add(name="bfruntime_info", number=2, type=_F.TYPE_BYTES, label=_F.LABEL_OPTIONAL)
    top.field.add(
        name="profiles",
        number=3,
        type=_F.TYPE_MESSAGE,
        label=_F.LABEL_REPEATED,
        type_name=".stratum.hal.barefoot.BfPipelineConfig.Profile",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    desc = pool.FindMessageTypeByName("stratum.hal.barefoot.BfPipelineConfig")
    return message_factory.GetMessageClass(desc)


BfPipelineConfig = _message_class()


class PipelineConfigError(Exception):
    """The bf-p4c output directory lacks a file the device configuration needs."""


@dataclass
class Profile:
    """One P4 pipeline of the compile: its name, context.json, tofino.bin, and pipes."""

    name: str
    context: bytes
    binary: bytes
    pipe_scope: tuple[int, ...] = DEFAULT_PIPE_SCOPE


@dataclass
class PipelineConfig:
    """What a BfPipelineConfig holds."""

    p4_name: str
    bfruntime_info: bytes
    profiles: list[Profile] = field(default_factory=list)

    def pack(self) -> bytes:
        """The serialized BfPipelineConfig (P4Runtime's p4_device_config)."""
        msg = BfPipelineConfig(p4_name=self.p4_name, bfruntime_info=self.bfruntime_info)
        for p in self.profiles:
            msg.profiles.add(  # type: ignore[attr-defined]
                profile_name=p.name, context=p.context, binary=p.binary, pipe_scope=p.pipe_scope
            )
        return msg.SerializeToString()

    @classmethod
    def unpack(cls, data: bytes) -> PipelineConfig:
        """The config a serialized BfPipelineConfig holds (what Stratum reads back)."""
        msg = BfPipelineConfig.FromString(data)
        profiles = [
            Profile(p.profile_name, p.context, p.binary, tuple(p.pipe_scope))
            for p in msg.profiles  # type: ignore[attr-defined]
        ]
        return cls(msg.p4_name, msg.bfruntime_info, profiles)  # type: ignore[attr-defined]


def from_compiler_output(
    out: Path, p4_name: str = "homagg_tna", pipe_scope: tuple[int, ...] = DEFAULT_PIPE_SCOPE
) -> PipelineConfig:
    """The config of a bf-p4c output directory: `bfrt.json` at its top, and each
    subdirectory holding `context.json` and `tofino.bin` (or tofino2.bin) a profile."""
    bfrt = out / "bfrt.json"
    if not bfrt.is_file():
        raise PipelineConfigError(f"{bfrt} is missing: compile with bf-p4c --bf-rt-schema")
    profiles = []
    for ctx in sorted(out.glob("*/context.json")):
        bins = sorted(ctx.parent.glob("tofino*.bin"))
        if len(bins) != 1:
            raise PipelineConfigError(
                f"{ctx.parent} has context.json but {len(bins)} tofino*.bin: was bf-p4c "
                "built with its assembler (bfas)?"
            )
        profiles.append(
            Profile(ctx.parent.name, ctx.read_bytes(), bins[0].read_bytes(), pipe_scope)
        )
    if not profiles:
        raise PipelineConfigError(f"no <pipe>/context.json under {out}: not a bf-p4c output")
    return PipelineConfig(p4_name, bfrt.read_bytes(), profiles)


def main(argv: list[str] | None = None) -> int:
    """Pack a bf-p4c output directory into the device config file a switch entry names."""
    p = argparse.ArgumentParser(
        prog="python -m homagg.control.tofino_pipeline", description=__doc__
    )
    p.add_argument("out", type=Path, help="bf-p4c output directory (-o of the compile)")
    p.add_argument("-o", "--output", type=Path, required=True, help="device config file")
    p.add_argument("--p4-name", default="homagg_tna", help="program name Stratum shows")
    p.add_argument(
        "--pipes", default="0,1,2,3", help="hardware pipes that run it (comma-separated)"
    )
    args = p.parse_args(argv)
    try:
        pipes = tuple(int(x) for x in args.pipes.split(",") if x)
        cfg = from_compiler_output(args.out, args.p4_name, pipes)
    except (PipelineConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    args.output.write_bytes(cfg.pack())
    sizes = ", ".join(f"{x.name}: {len(x.binary)} B binary" for x in cfg.profiles)
    print(f"{args.output}: BfPipelineConfig {cfg.p4_name} ({sizes})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
