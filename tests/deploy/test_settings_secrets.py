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
