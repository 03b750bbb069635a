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


def test_an_sb3_export_into_a_folder_with_files_is_refused_unless_forced(tmp_path: Path) -> None:
    _run_dir, (ckpt,) = write_bandit_run(tmp_path / "runs", train_steps=(0,))
    out = tmp_path / "export"
    assert gradlab("export", str(ckpt), "--format", "sb3", "--out", str(out)).returncode == 0
    (out / "vecnormalize.pkl").write_bytes(b"an earlier export's statistics")  # the bandit writes none
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    refused = gradlab("export", str(ckpt), "--format", "sb3", "--out", str(out))
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [f"error: --out {out}: expected a new or empty folder, found "
                                                   "files in it; pass --force to replace it"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing touched
    forced = gradlab("export", str(ckpt), "--format", "sb3", "--out", str(out), "--force")
    assert forced.returncode == 0, forced.stderr
    assert sorted(p.name for p in out.iterdir()) == ["gradlab_export.json", "policy.zip"]  # no stale file left
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")  # not an export: never deleted, even with --force
    kept = gradlab("export", str(ckpt), "--format", "sb3", "--out", str(mine), "--force")
    assert kept.returncode == 1 and kept.stderr.strip() == (f"error: --out {mine}: not an earlier export (no "
                                                            "gradlab_export.json): not replaced, even with --force")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_an_rl_zoo_export_over_an_existing_run_folder_is_refused_unless_forced(cartpole_run: Path,
                                                                              tmp_path: Path) -> None:
    ckpt = sorted((cartpole_run / "checkpoints").iterdir())[-1]
    out = tmp_path / "zoo"
    other = out / "ppo" / "Acrobot-v1_1"  # another run's folder in the same rl-zoo log folder
    other.mkdir(parents=True)
    (other / "Acrobot-v1.zip").write_bytes(b"acrobot")
    assert gradlab("export", str(ckpt), "--out", str(out)).returncode == 0
    run_folder = out / "ppo" / "CartPole-v1_1"
    (run_folder / "CartPole-v1" / "vecnormalize.pkl").write_bytes(b"stale")
    refused = gradlab("export", str(ckpt), "--out", str(out))
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [f"error: --out {out}: {run_folder} exists (an earlier export); "
                                                   "pass --force to replace it"]
    assert (run_folder / "CartPole-v1" / "vecnormalize.pkl").read_bytes() == b"stale"
    forced = gradlab("export", str(ckpt), "--out", str(out), "--force")
    assert forced.returncode == 0, forced.stderr
    assert not (run_folder / "CartPole-v1" / "vecnormalize.pkl").exists()  # replaced cleanly
    assert (run_folder / "CartPole-v1.zip").read_bytes() == (ckpt / "policy.zip").read_bytes()
    assert (other / "Acrobot-v1.zip").read_bytes() == b"acrobot"  # the other run's folder kept
