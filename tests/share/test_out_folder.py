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


def test_eval_video_that_is_a_file_is_refused_before_evaluating(tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    out = gradlab("eval", "any-run", "--video", str(target))
    assert out.returncode == 1 and out.stderr.strip() == f"error: --video {target}: expected a folder, found a file"
    assert target.read_text() == "mine"


def test_a_malformed_hub_repository_id_is_a_config_error_naming_it() -> None:
    import pytest

    from gradlab.errors import ConfigError
    from gradlab.share.hub import parse_hf_ref

    assert parse_hf_ref("hf://alice/bandit-ppo") == "alice/bandit-ppo"
    for ref in ("hf://../x", "hf://alice/-x", "hf://al ice/x", "hf://alice/" + "n" * 97):
        with pytest.raises(ConfigError, match="expected hf://OWNER/NAME"):
            parse_hf_ref(ref)
