"""The eBPF target: the homagg data plane in the Linux kernel (docs/ebpf.md)."""
