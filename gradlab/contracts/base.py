"""Base model shared by every contract: frozen, unknown keys forbidden."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError


class Contract(BaseModel):
    """A frozen pydantic model that refuses unknown keys at every level."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False)


class NestedValidationError(ValueError):
    """Raised inside a validator that validates a free-form dict against another model.

    Carries the inner errors with their locations relative to ``prefix`` so the error report can
    name the full key path (``train.backend.config.n_stepz``) instead of the enclosing model.
    """

    def __init__(self, prefix: tuple[str, ...], error: ValidationError, model: type[BaseModel]):
        self.prefix = prefix
        self.errors = error.errors(include_url=False)
        self.model = model
        first = self.errors[0] if self.errors else {"loc": (), "msg": str(error)}
        loc = ".".join(str(p) for p in (*prefix, *first["loc"]))
        super().__init__(f"{loc}: {first['msg']}")


def validate_nested(model: type[BaseModel], data: Any, prefix: tuple[str, ...]) -> dict[str, Any]:
    """Validate ``data`` against ``model`` and return its JSON dump (defaults filled).

    Raises:
        NestedValidationError: with the inner errors, located under ``prefix``.
    """
    try:
        return model.model_validate(data).model_dump(mode="json")
    except ValidationError as e:
        raise NestedValidationError(prefix, e, model) from None
