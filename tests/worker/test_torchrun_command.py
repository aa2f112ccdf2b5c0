"""homagg-run's reading of the torchrun it wraps (homagg/worker/job/torchrun_command.py): the job's
world size from torchrun's options, and the misuses a launcher can see before it makes a
job: another node's torchrun, a --world-size that is not torchrun's, ranks it cannot count."""

from __future__ import annotations

import pytest

from homagg.worker.job.torchrun_command import plan_world, read_torchrun

SCRIPT = ["train.py", "--nnodes", "9"]  # the script's own options are not torchrun's


def test_torchrun_in_both_spellings_gives_the_world_size():
    for head in (["torchrun"], ["/usr/bin/python3", "-m", "torch.distributed.run"]):
        command = [*head, "--nnodes", "2", "--nproc-per-node", "3", *SCRIPT]
        assert plan_world(None, command)[0] == 6
        assert plan_world(6, command)[0] == 6
    assert plan_world(None, ["torchrun", "--nproc_per_node=4", *SCRIPT]) == (4, [])


def test_other_commands_need_the_world_size():
    assert plan_world(2, ["python", "train.py"]) == (2, [])
    assert read_torchrun(["python", "-c", "torchrun"]) is None
    with pytest.raises(ValueError, match="give --world-size: the command is not a torchrun"):
        plan_world(None, ["mpirun", "-n", "2", "python", "train.py"])


def test_another_node_ranks_torchrun_is_refused():
    command = ["torchrun", "--nnodes", "2", "--node-rank", "1", "--master-addr", "h0", *SCRIPT]
    with pytest.raises(ValueError, match="this torchrun is node rank 1: run homagg-run once"):
        plan_world(None, command)


def test_node_rank_from_torchruns_environment(monkeypatch):
    monkeypatch.setenv("PET_NODE_RANK", "3")
    with pytest.raises(ValueError, match="node rank 3"):
        plan_world(None, ["torchrun", "--nnodes", "4", *SCRIPT])


def test_a_world_size_that_is_not_torchruns_is_refused():
    with pytest.raises(ValueError, match=r"--world-size 3, but torchrun starts 1 node\(s\) x 2"):
        plan_world(3, ["torchrun", "--nproc-per-node", "2", *SCRIPT])


def test_ranks_torchrun_decides_need_the_world_size():
    for opts in (["--nnodes", "1:4"], ["--nproc-per-node", "auto"]):
        with pytest.raises(ValueError, match="give --world-size: torchrun's --nnodes"):
            plan_world(None, ["torchrun", *opts, *SCRIPT])
        assert plan_world(8, ["torchrun", *opts, *SCRIPT])[0] == 8


def test_several_nodes_get_a_note_and_dynamic_rendezvous_a_warning():
    _, notes = plan_world(None, ["torchrun", "--nnodes", "2", "--master-addr", "h0", *SCRIPT])
    assert len(notes) == 1 and "start torchrun on the other nodes yourself" in notes[0]
    command = ["torchrun", "--nnodes", "2", "--rdzv-backend", "c10d", "--node-rank", "1", *SCRIPT]
    _, notes = plan_world(None, command)  # the node rank means nothing under c10d rendezvous
    assert len(notes) == 2 and "rendezvous 'c10d' decides which node gets rank 0" in notes[0]
    assert plan_world(None, ["torchrun", "--standalone", "--nproc-per-node", "2", *SCRIPT]) == (
        2,
        [],
    )


def test_a_torchrun_command_torchrun_would_refuse_is_left_to_torchrun():
    assert read_torchrun(["torchrun", "--nnodes", "two", *SCRIPT]) is None
    assert read_torchrun(["torchrun", "--no-such-option", *SCRIPT]) is None
