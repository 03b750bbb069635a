"""The provider registry: the ``gradlab.providers`` entry-point group.

Each entry point names a module attribute ``provider``: a :class:`gradlab.envs.backend.Provider`
instance (or a zero-argument callable returning one). gradlab's own five are declared in
``pyproject.toml`` and also known here, so a source checkout without installed metadata works.
Third parties add providers by declaring an entry point in the same group.
"""

from __future__ import annotations

import difflib
import importlib
import logging
from functools import cache
from typing import Any

from gradlab.envs.backend import Provider
from gradlab.errors import NotFound

logger = logging.getLogger(__name__)

GROUP = "gradlab.providers"

BUILTIN_PROVIDERS: dict[str, str] = {
    "gradlab": "gradlab.envs.providers.builtin:provider",
    "gymnasium": "gradlab.envs.providers.gym:provider",
    "ale": "gradlab.envs.providers.ale:provider",
    "vizdoom": "gradlab.envs.providers.vizdoom:provider",
    "retro": "gradlab.envs.providers.retro:provider",
}


@cache
def _entry_points() -> dict[str, str]:
    from importlib.metadata import entry_points

    found = dict(BUILTIN_PROVIDERS)
    for ep in entry_points(group=GROUP):
        found[ep.name] = ep.value
    return found


def provider_names() -> list[str]:
    """Registered provider names, gradlab's own first."""
    names = list(_entry_points())
    return [n for n in BUILTIN_PROVIDERS if n in names] + sorted(n for n in names if n not in BUILTIN_PROVIDERS)


@cache
def get_provider(name: str) -> Provider:
    """The provider registered as ``name``.

    Raises:
        NotFound: no provider of that name (the message lists the registered ones).
    """
    target = _entry_points().get(name)
    if target is None:
        hint = difflib.get_close_matches(name, provider_names(), n=1)
        raise NotFound(f"unknown environment provider '{name}'"
                       + (f" (did you mean {hint[0]}?)" if hint else f"; providers: {', '.join(provider_names())}"))
    module_name, _, attr = target.partition(":")
    obj: Any = getattr(importlib.import_module(module_name), attr or "provider")
    if not isinstance(obj, Provider) and callable(obj):
        obj = obj()
    if not isinstance(obj, Provider):
        raise NotFound(f"entry point {GROUP}:{name} -> {target} is not a gradlab Provider")
    return obj


def list_providers() -> list[dict[str, Any]]:
    """``[{provider, available, version, env_ids, reason}]`` for every registered provider.

    ``env_ids`` is empty for an unavailable provider; ``reason`` says why it is unavailable.
    """
    rows = []
    for name in provider_names():
        try:
            prov = get_provider(name)
            available, reason = prov.availability()
            version = prov.version()
            env_ids = prov.env_ids() if available else []
        except Exception as e:  # noqa: BLE001 - a broken third-party provider must not hide the others
            available, reason, version, env_ids = False, f"{type(e).__name__}: {e}", None, []
        rows.append({"provider": name, "available": available, "version": version, "env_ids": env_ids,
                     "reason": reason})
    return rows


def provider_info(name: str) -> dict[str, Any]:
    """One row of :func:`list_providers` for ``name``.

    Raises:
        NotFound: unknown provider.
    """
    get_provider(name)
    for row in list_providers():
        if row["provider"] == name:
            return row
    raise NotFound(f"unknown environment provider '{name}'")  # pragma: no cover


def describe(spec_or_ref: Any):
    """:class:`gradlab.envs.backend.EnvInfo` for an EnvironmentSpec or a ``PROVIDER:ENV_ID`` string."""
    from gradlab.contracts.environment import EnvironmentSpec

    if isinstance(spec_or_ref, str):
        provider, sep, env_id = spec_or_ref.partition(":")
        if not sep or not env_id:
            raise NotFound(f"expected PROVIDER:ENV_ID, found {spec_or_ref!r}")
        spec = EnvironmentSpec(provider=provider, env_id=env_id)
    else:
        spec = spec_or_ref
    provider = get_provider(spec.provider)
    if spec.action_profile is None:
        return provider.describe(spec)
    from gradlab.envs.action_profile import native_table, profiled_info

    native_table(provider, spec)  # a profile that does not fit fails before an emulator starts
    return profiled_info(provider, spec, provider.describe(spec))
