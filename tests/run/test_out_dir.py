"""run/out_dir.py: a run empties only a new, empty or earlier run's output directory."""

import argparse
from pathlib import Path

import pytest

from run import out_dir
from run.__main__ import _prepare_out


def test_a_new_directory_is_made_and_marked(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    out_dir.prepare(out)
    assert (out / out_dir.MARKER).is_file()


def test_an_earlier_runs_files_are_removed_and_its_subdirectories_kept(tmp_path: Path) -> None:
    out_dir.prepare(tmp_path)
    (tmp_path / "switch.jsonl").write_text("{}")
    (tmp_path / "switch").mkdir()
    (tmp_path / "switch" / "model.pt").write_text("x")
    out_dir.prepare(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [out_dir.MARKER, "switch"]
    assert (tmp_path / "switch" / "model.pt").exists()


def test_a_directory_of_foreign_files_is_refused_and_left_alone(tmp_path: Path) -> None:
    for name in ("notes.txt", "thesis.tex", "data.csv", "z.py"):
        (tmp_path / name).write_text("mine")
    with pytest.raises(out_dir.OutDirError, match=r"4 entries no earlier run wrote \(data.csv"):
        out_dir.prepare(tmp_path)
    assert len(list(tmp_path.iterdir())) == 4


def test_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("mine")
    with pytest.raises(out_dir.OutDirError, match="not a directory"):
        out_dir.check(f)
    assert f.read_text() == "mine"


def test_main_refuses_a_foreign_out_with_status_2_before_building_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from run import __main__ as cli

    (tmp_path / "keep.txt").write_text("mine")
    monkeypatch.setattr(cli.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cli, "run", lambda args: pytest.fail("run() must not start"))
    assert cli.main(["--out", str(tmp_path)]) == 2
    assert "no earlier run wrote (keep.txt)" in capsys.readouterr().err
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_the_runs_own_directory_is_emptied_whatever_it_holds(tmp_path: Path) -> None:
    (tmp_path / "switch.jsonl").write_text("{} from a run before the marker existed")
    out_dir.prepare(tmp_path, own=True)
    assert [p.name for p in tmp_path.iterdir()] == [out_dir.MARKER]


def test_a_relative_out_is_made_absolute(tmp_path: Path, monkeypatch) -> None:
    """The ranks start in their hosts' own working directories: a relative --out would be
    another directory to them (the run's step records lost)."""
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(out=Path("runs/one"))
    _prepare_out(args, names=None)  # type: ignore[arg-type]  # not read: --out given
    assert args.out == tmp_path.resolve() / "runs" / "one"
    assert (args.out / out_dir.MARKER).is_file()
