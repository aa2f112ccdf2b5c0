"""The worker side: homomorphic gradient codecs (homagg.worker.codecs), the agent that joins a job
through the controller (agent.py), the transport of codec phases through the switch
(transport.py, channel.py) and the PyTorch DDP communication hook (ddp_hook.py)."""
