"""Which requesters a warm learner serves (``ZygoteInfo.serves``): the import-sensitive variables
must be the ones it imported with, where a value its own imports set counts as the one it started with."""

from __future__ import annotations

from gradlab.learn.zygote import ZygoteInfo


def _info(import_env: dict[str, str], set_by_imports: dict[str, str]) -> ZygoteInfo:
    return ZygoteInfo(pid=1, address="\0x", fingerprint="0" * 64, import_env=import_env,
                      set_by_imports=set_by_imports, keeper_pid=None, ready_at=0.0)


def test_a_value_the_zygotes_own_imports_set_still_matches() -> None:
    # OpenCV, imported under SB3, prepends its folder to LD_LIBRARY_PATH in the importing process.
    cv2 = "/venv/site-packages/cv2/../../lib64:"
    info = _info({}, {"LD_LIBRARY_PATH": cv2})
    assert info.serves({})  # a requester that has not imported OpenCV
    assert info.serves({"LD_LIBRARY_PATH": cv2})  # one that has (a warm flow: it preloads SB3 too)
    assert not info.serves({"LD_LIBRARY_PATH": "/opt/other"})  # a requester started with its own
    started_with = _info({"LD_LIBRARY_PATH": "/opt/cuda"}, {"LD_LIBRARY_PATH": cv2 + "/opt/cuda"})
    assert started_with.serves({"LD_LIBRARY_PATH": "/opt/cuda"})
    assert started_with.serves({"LD_LIBRARY_PATH": cv2 + "/opt/cuda"})
    assert not started_with.serves({})


def test_any_other_difference_is_not_served() -> None:
    info = _info({"OMP_NUM_THREADS": "2"}, {})
    assert info.serves({"OMP_NUM_THREADS": "2"})
    assert not info.serves({"OMP_NUM_THREADS": "7"})
    assert not info.serves({})
    assert not info.serves({"OMP_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": ""})


def test_a_zygote_file_written_before_the_field_existed_still_reads() -> None:
    info = ZygoteInfo.model_validate_json('{"pid": 1, "address": "x", "fingerprint": "f", "import_env": {},'
                                          ' "keeper_pid": null, "ready_at": 0}')
    assert info.set_by_imports == {} and info.serves({})


def test_the_launch_environment_undoes_what_imports_in_this_process_changed(monkeypatch) -> None:
    import os
    from pathlib import Path

    from gradlab.learn import zygote

    raw = Path("/proc/self/environ").read_bytes().decode(errors="surrogateescape")
    at_exec = dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
    # What importing OpenCV does to the importing process; a gradlab variable set here stays.
    monkeypatch.setenv("LD_LIBRARY_PATH", "/venv/site-packages/cv2/../../lib64:" + os.environ.get("LD_LIBRARY_PATH", ""))
    monkeypatch.setenv("GRADLAB_SOMETHING", "kept")
    env = zygote.launch_environ()
    assert env.get("LD_LIBRARY_PATH") == at_exec.get("LD_LIBRARY_PATH")
    assert env["GRADLAB_SOMETHING"] == "kept"
    # A child a zygote forked runs with its requester's environment, not the zygote's exec one.
    monkeypatch.setattr(zygote, "_adopted_import_env", None)
    zygote.adopt_launch_env({"OMP_NUM_THREADS": "3", "HOME": "/x"})
    assert zygote.launch_import_env() == {"OMP_NUM_THREADS": "3"}
