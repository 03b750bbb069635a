"""The lock serves both supported platforms and keeps its package-age gate.

``uv.lock`` is read as TOML, offline: for Linux x86_64 and macOS arm64 every locked package that
the platform installs has a file it can install (a wheel for that platform, a pure-Python wheel or
an sdist), and the lock was made with the seven-day ``exclude-newer`` span of ``pyproject.toml``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.markers import Marker

ROOT = Path(__file__).resolve().parents[1]

#: Marker environments of the two platforms (what ``platform_machine``/``sys_platform`` say there).
PLATFORMS = {
    "linux-x86_64": ({"sys_platform": "linux", "platform_machine": "x86_64", "platform_system": "Linux"},
                     ("manylinux", "x86_64")),
    "macos-arm64": ({"sys_platform": "darwin", "platform_machine": "arm64", "platform_system": "Darwin"},
                    ("macosx", "arm64")),
}


def _lock() -> dict:
    return tomllib.loads((ROOT / "uv.lock").read_text())


def _installed_on(lock: dict, environment: dict[str, str]) -> set[str]:
    """Names of the locked packages a platform installs: the closure from gradlab over every
    dependency whose marker holds there (every extra and group included, as CI installs them)."""
    packages = {p["name"]: p for p in lock["package"]}
    python = {"python_version": "3.12", "python_full_version": "3.12.8", "implementation_name": "cpython",
              "platform_python_implementation": "CPython", "os_name": "posix"}

    def holds(marker: str | None) -> bool:
        return marker is None or Marker(marker).evaluate(python | environment | {"extra": ""})

    seen: set[str] = set()
    todo = ["gradlab"]
    while todo:
        name = todo.pop()
        if name in seen or name not in packages:
            continue
        seen.add(name)
        package = packages[name]
        edges = list(package.get("dependencies", []))
        for group in ("optional-dependencies", "dev-dependencies"):
            for deps in package.get(group, {}).values():
                edges += deps
        todo += [edge["name"] for edge in edges if holds(edge.get("marker"))]
    return seen


def test_the_lock_names_both_platforms_and_the_age_gate() -> None:
    lock = _lock()
    assert lock["supported-markers"] == [
        "platform_machine == 'x86_64' and sys_platform == 'linux'",
        "platform_machine == 'arm64' and sys_platform == 'darwin'",
    ]
    assert lock["options"]["exclude-newer-span"] == "P7D"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["tool"]["uv"]["exclude-newer"] == "7 days"


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_every_package_a_platform_installs_has_a_file_for_it(platform: str) -> None:
    environment, (tag, machine) = PLATFORMS[platform]
    lock = _lock()
    packages = {p["name"]: p for p in lock["package"]}
    installed = _installed_on(lock, environment)
    assert {"torch", "ale-py", "vizdoom", "stable-retro", "prefect"} <= installed
    missing = []
    for name in sorted(installed - {"gradlab"}):
        package = packages[name]
        urls = [wheel["url"] for wheel in package.get("wheels", [])]
        fits = any(url.endswith("-none-any.whl") or (tag in url and machine in url) for url in urls)
        if not fits and "sdist" not in package:
            missing.append(f"{name} {package['version']}")
    assert missing == [], f"no installable file on {platform}: {missing}"
