"""PyTorch integration: the DDP communication hook, its communication thread, DeAR, the
`homagg` torch.distributed backend and `attach`."""
