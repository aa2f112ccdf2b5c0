"""`make run`: a Mininet topology around one P4 switch, the controller, and a torchrun job
whose gradients are summed by the switch, compared with the same job over gloo."""
