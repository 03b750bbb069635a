"""Operator config: secret references only, and 0600 when the file names one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gradlab.errors import ConfigError
from gradlab.settings import load_settings, resolve_secret

CONFIG_WITH_REF = """
[stores]
control = "s3://gradlab/control"
endpoint_url = "https://acct.r2.cloudflarestorage.com"
s3_secret_ref = "env:R2_SECRET"

[wandb]
mode = "online"
api_key_ref = "keyring:gradlab/wandb"
"""


def write_config(home: Path, text: str, mode: int) -> Path:
    path = Path(os.environ["GRADLAB_CONFIG"])
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_file_naming_a_secret_reference_must_be_0600(gradlab_home: Path) -> None:
    path = write_config(gradlab_home, CONFIG_WITH_REF, 0o644)
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value) == (f"{path}: names secret reference(s) (stores.s3_secret_ref, wandb.api_key_ref) but its "
                              f"mode is 0644; expected 0600 (owner read/write only): run chmod 600 {path}")
    path.chmod(0o640)
    with pytest.raises(ConfigError, match="mode is 0640"):
        load_settings()
    path.chmod(0o600)
    settings = load_settings()
    assert settings.secret_refs == (("stores.s3_secret_ref", "env:R2_SECRET"), ("wandb.api_key_ref", "keyring:gradlab/wandb"))
    assert settings.control_store_url == "s3://gradlab/control" and settings.wandb_mode == "online"


def test_a_file_without_secret_references_may_be_world_readable(gradlab_home: Path) -> None:
    write_config(gradlab_home, '[prefect]\napi_url = "http://127.0.0.1:4200/api"\n', 0o644)
    settings = load_settings()
    assert settings.secret_refs == () and settings.prefect_api_url == "http://127.0.0.1:4200/api"


def test_literal_secrets_and_malformed_references_are_refused_together(gradlab_home: Path) -> None:
    path = write_config(gradlab_home, '[stores]\nsecret_access_key = "abc123"\ns3_secret_ref = "R2_SECRET"\n'
                        '[wandb]\napi_key = "k"\n', 0o600)
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert [(p.file, p.key_path) for p in err.value.problems] == [
        (str(path), "stores.secret_access_key"), (str(path), "stores.s3_secret_ref"), (str(path), "wandb.api_key")]
    first, second, _ = err.value.problems
    assert first.message.startswith("literal secret refused") and 'secret_access_key_ref = "env:NAME"' in first.message
    assert second.message == "expected a secret reference \"env:NAME\" or \"keyring:SERVICE/USERNAME\", found 'R2_SECRET'"
    assert "abc123" not in str(err.value)


def test_resolve_secret_reads_the_environment_and_needs_keyring_for_keyring(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("R2_SECRET", "s3cr3t")
    assert resolve_secret("env:R2_SECRET") == "s3cr3t"
    monkeypatch.delenv("R2_SECRET")
    assert resolve_secret("env:R2_SECRET") is None
    with pytest.raises(ConfigError, match="expected env:NAME or keyring:SERVICE/USERNAME"):
        resolve_secret("file:/etc/passwd")
    try:
        import keyring  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="needs the 'keyring' package"):
            resolve_secret("keyring:gradlab/wandb")


# -- secret references reach the clients that use them, and nothing else -------------------------

def _files_containing(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def test_wandb_api_key_ref_reaches_wandb_init(gradlab_home: Path, monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    """``[wandb] api_key_ref`` is resolved where the sink starts W&B and handed to ``wandb.init``
    (captured at the SDK boundary: W&B's cloud cannot be reached here); it is written nowhere."""
    import secrets

    import wandb

    from gradlab.contracts.run_spec import new_run_id
    from gradlab.runs import operations

    key = secrets.token_hex(20)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("GRADLAB_TEST_WANDB_KEY", key)
    write_config(gradlab_home, '[wandb]\nmode = "online"\napi_key_ref = "env:GRADLAB_TEST_WANDB_KEY"\n', 0o600)
    seen: list[dict] = []

    def init(**kwargs):  # W&B's own entry point, replaced: the cloud is unreachable from here
        seen.append(kwargs)
        raise wandb.errors.CommError("W&B cloud not reachable from the test machine")

    monkeypatch.setattr(wandb, "init", init)
    settings = load_settings()
    spec, paths = operations.prepare_spec(settings, recipe="gradlab__bandit/ppo", run_id=new_run_id())
    with caplog.at_level("DEBUG"):
        sink = operations.wandb_sink(settings, spec, paths, "online")
        assert sink.wait_ready(30)
    assert len(seen) == 1 and seen[0]["settings"].api_key == key and seen[0]["mode"] == "online"
    assert sink.status == "pending" and key not in (sink.error or "")
    assert key not in caplog.text and _files_containing(gradlab_home, key) == []

    # WANDB_API_KEY wins: W&B reads it itself and the reference is not even resolved.
    monkeypatch.setenv("WANDB_API_KEY", "from-the-environment")
    monkeypatch.delenv("GRADLAB_TEST_WANDB_KEY")
    sink = operations.wandb_sink(settings, spec, paths, "online")
    assert sink.wait_ready(30) and seen[1]["settings"].api_key is None
    # Offline never hands a key to W&B.
    monkeypatch.setenv("GRADLAB_TEST_WANDB_KEY", key)
    sink = operations.wandb_sink(settings, spec, paths, "offline")
    assert sink.wait_ready(30) and seen[2]["settings"].api_key is None and seen[2]["mode"] == "offline"


def test_train_online_accepts_a_resolving_wandb_ref_and_names_an_unset_one(gradlab_home: Path,
                                                                            experiments_copy: Path) -> None:
    import subprocess
    import sys

    goal = experiments_copy / "goals" / "gradlab__bandit" / "_goal.yaml"
    goal.write_text(goal.read_text().replace("env_id: Bandit-v0", "env_id: Bandit-v9"))  # stops train before a run
    write_config(gradlab_home, '[wandb]\napi_key_ref = "env:GRADLAB_TEST_WANDB_KEY"\n', 0o600)
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "GRADLAB_TEST_WANDB_KEY")}
    env["HOME"] = str(gradlab_home)  # no ~/.netrc
    cmd = [sys.executable, "-m", "gradlab.cli.app", "train", "gradlab__bandit/ppo", "--wandb", "online"]
    unset = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert unset.returncode == 1
    assert "wandb.api_key_ref: secret reference env:GRADLAB_TEST_WANDB_KEY is not set" in unset.stderr, unset.stderr
    resolved = subprocess.run(cmd, capture_output=True, text=True, env={**env, "GRADLAB_TEST_WANDB_KEY": "k" * 40},
                              timeout=120)
    assert resolved.returncode == 1 and "no W&B API key" not in resolved.stderr
    assert "no environment 'Bandit-v9'" in resolved.stderr, resolved.stderr  # got past the key check
    assert not (gradlab_home / "runs").exists()


def test_s3_secret_refs_reach_the_s3_client(gradlab_home: Path, monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """moto's S3 server with IAM authentication on: a request is served only when signed with the
    secret key of a real IAM access key, so a store that works proves the reference reached the client."""
    import json

    import botocore.session
    import moto.settings

    from gradlab.stores import open_stores
    from tests.s3server import running_s3_server

    with running_s3_server(set_env=False) as server:
        iam = botocore.session.get_session().create_client(
            "iam", endpoint_url=server.endpoint_url, region_name="us-east-1",
            aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
        iam.create_user(UserName="gradlab")
        policy = iam.create_policy(PolicyName="s3-all", PolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        iam.attach_user_policy(UserName="gradlab", PolicyArn=policy["Policy"]["Arn"])
        access = iam.create_access_key(UserName="gradlab")["AccessKey"]
        monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # from now on every request is checked

        for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(gradlab_home / "no-aws-credentials"))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(gradlab_home / "no-aws-config"))
        monkeypatch.setenv("GRADLAB_TEST_KEY_ID", access["AccessKeyId"])
        monkeypatch.setenv("GRADLAB_TEST_SECRET", access["SecretAccessKey"])
        write_config(gradlab_home, f'[stores]\ncontrol = "{server.url("control")}"\n'
                     f'endpoint_url = "{server.endpoint_url}"\n'
                     's3_access_key_id_ref = "env:GRADLAB_TEST_KEY_ID"\ns3_secret_ref = "env:GRADLAB_TEST_SECRET"\n',
                     0o600)
        with caplog.at_level("DEBUG", logger="gradlab"):
            control = open_stores(load_settings()).control
            control.put_create_only("probe/object.json", b'{"ok": true}')
            assert control.get("probe/object.json") == b'{"ok": true}'

        # The same access key id with another secret is refused by the server: the secret is what signs.
        monkeypatch.setenv("GRADLAB_TEST_SECRET", access["SecretAccessKey"][::-1])
        with pytest.raises(ConfigError, match="403"):
            open_stores(load_settings()).control.get("probe/object.json")
        # An unset reference is named, before any request.
        monkeypatch.delenv("GRADLAB_TEST_SECRET")
        with pytest.raises(ConfigError, match="stores.s3_secret_ref: secret reference env:GRADLAB_TEST_SECRET is not set"):
            open_stores(load_settings())
    secret = access["SecretAccessKey"]
    assert secret not in caplog.text and _files_containing(gradlab_home, secret) == []
