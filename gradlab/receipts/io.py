"""Reading and writing receipt models on an object store."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from gradlab.errors import Conflict, ContractViolation, NotFound
from gradlab.stores import ObjectStore

M = TypeVar("M", bound=BaseModel)


def dump_model(model: BaseModel) -> bytes:
    """Deterministic JSON bytes of a receipt (sorted keys, 2-space indent, trailing newline)."""
    return (json.dumps(model.model_dump(mode="json"), sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()


def parse_model(data: bytes, cls: type[M], where: str) -> M:
    """Validate stored bytes as ``cls``.

    Raises:
        ContractViolation: the bytes are not valid JSON for ``cls`` (names ``where``).
    """
    try:
        return cls.model_validate_json(data)
    except ValidationError as e:
        raise ContractViolation(f"{where}: not a valid {cls.__name__}: {e}") from None


def read_model(store: ObjectStore, key: str, cls: type[M]) -> M:
    """Read and validate the receipt at ``key``.

    Raises:
        NotFound: no object at ``key``. ContractViolation: the object is not a valid ``cls``.
    """
    return parse_model(store.get(key), cls, store.url(key))


def read_model_with_etag(store: ObjectStore, key: str, cls: type[M]) -> tuple[M, str]:
    data, etag = store.get_with_etag(key)
    return parse_model(data, cls, store.url(key)), etag


def read_optional(store: ObjectStore, key: str, cls: type[M]) -> M | None:
    """Like :func:`read_model`, None when the key does not exist."""
    try:
        return read_model(store, key, cls)
    except NotFound:
        return None


def create_or_agree(
    store: ObjectStore, key: str, model: M, *, agree: Callable[[M, M], bool], what: str
) -> M:
    """Create-only write of ``model``; when one exists already, return it if ``agree(existing, model)``.

    Returns:
        The receipt now stored at ``key`` (``model`` or the agreeing existing one).

    Raises:
        Conflict: a different, disagreeing receipt exists at ``key``.
    """
    try:
        store.put_create_only(key, dump_model(model))
        return model
    except Conflict:
        existing = read_model(store, key, type(model))
        if agree(existing, model):
            return existing
        raise Conflict(f"{store.url(key)}: {what} already exists and disagrees: {_differences(existing, model)}") from None


def _differences(existing: BaseModel, new: BaseModel, limit: int = 160) -> str:
    """The top-level fields that differ, each as ``field: existing → new`` (values cut to ``limit`` chars)."""
    old, now = existing.model_dump(mode="json"), new.model_dump(mode="json")

    def short(value: object) -> str:
        text = json.dumps(value, sort_keys=True)
        return text if len(text) <= limit else text[: limit - 1] + "…"

    fields = [k for k in {**old, **now} if old.get(k) != now.get(k)]
    return "; ".join(f"{k}: {short(old.get(k))} → {short(now.get(k))}" for k in fields) or "(same fields)"
