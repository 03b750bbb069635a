"""``gradlab export`` / ``publish`` with an ``--out`` that is a file: one error line, exit 1, the file kept."""

from __future__ import annotations

from pathlib import Path

from tests.evaluation.conftest import write_bandit_run
from tests.share.conftest import gradlab


def test_an_out_that_is_a_file_is_one_error_line_and_the_file_is_kept(tmp_path: Path) -> None:
    _run_dir, (ckpt,) = write_bandit_run(tmp_path / "runs", train_steps=(0,))
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    for args, expected in [(["export", str(ckpt), "--format", "sb3"], f"--out {target}: expected a folder, found a file"),
                           (["publish", str(ckpt), "--allow-unaccepted"], f"--out {target}: expected a new or empty "
                                                                          "folder, found a file")]:
        out = gradlab(*args, "--out", str(target))
        assert out.returncode == 1, (args, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0] == f"error: {expected}", (args, out.stderr)
        assert target.read_text() == "mine"
