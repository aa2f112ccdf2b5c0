"""The worker's path to the switch: datagram channels, the self-clocked pool of slots in
flight, chunk numbering, retransmission timing, what a slow rank does, and the two I/O
paths (batched through sendmmsg / recvmmsg, or one datagram at a time)."""
