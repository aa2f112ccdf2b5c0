"""The worker's path to the switch: datagram channels, the self-clocked pool of slots in
flight, chunk numbering, retransmission timing and what a slow rank does."""
