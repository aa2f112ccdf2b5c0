"""python -m homagg.ebpf: the eBPF switch, with the reference switch's command line."""

import sys

from homagg.ebpf.switch import EbpfSwitch
from homagg.refswitch.cli import serve

if __name__ == "__main__":
    sys.exit(serve(None, EbpfSwitch, "ebpfswitch"))
