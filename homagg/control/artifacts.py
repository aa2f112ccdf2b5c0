"""The compiled P4 program committed under p4src/build (make p4 rebuilds it)."""

from pathlib import Path

BUILD_DIR = Path(__file__).resolve().parents[2] / "p4src" / "build"
P4INFO_PATH = BUILD_DIR / "homagg.p4info.txtpb"
BMV2_JSON_PATH = BUILD_DIR / "homagg.json"
