"""P4Runtime for Python: the protobuf modules regenerated from the p4runtime wheel (`api`),
P4Info lookups (`p4info`) and the byte strings of P4Runtime values (`bytestrings`)."""
