"""The worker agent: gradient codecs and (later) the transport through the switch."""
