"""The worker side: homomorphic gradient codecs (codecs/), the transport of codec phases
through the switch (transport/), the PyTorch integration: the DDP communication hook, DeAR,
the torch.distributed backend and attach (ddp/), codec="auto" (auto/), and a job from a
rank's side: the agent, the set-up the ranks do together, homagg-run (job/)."""
