"""`make run`: a Mininet topology around one P4 switch, the controller, and a torchrun job
whose gradients are summed by the switch, compared with the same job over gloo."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The repository: the processes a run starts import the project from it (PYTHONPATH)."""
