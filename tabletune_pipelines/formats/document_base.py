"""What every document shares: ``Document``, the JSON round-trip with a ``schema`` tag and a
``schema_version`` (a document of another kind or a newer version fails with a message that says
which; a missing, unknown or mistyped field is a ``DocumentError`` naming it), and the digest and
slug the documents' ids and keys are made of. The documents themselves are in ``formats.documents``.
Stdlib only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from tabletune_pipelines.errors import DocumentError, SchemaVersionError, TableTuneError
from tabletune_pipelines.formats import strict_io

__all__ = ["SCHEMA_VERSION", "Document", "digest", "slug"]

SCHEMA_VERSION = 1

T = TypeVar("T", bound="Document")


def digest(obj: Any, n: int = 12) -> str:
    """The first ``n`` hex digits of the SHA-256 of ``obj`` as canonical JSON (sorted keys, no spaces)."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:n]


def slug(text: str) -> str:
    """The last path part of ``text`` with every run of other characters than letters, digits, '.', '_'
    and '-' made one '-', at most 40 characters (``"none"`` when nothing is left)."""
    tail = text.rstrip("/").split("/")[-1] or text
    return re.sub(r"[^A-Za-z0-9._-]+", "-", tail)[:40] or "none"


class Document:
    """JSON round-trip with a schema tag and version."""

    SCHEMA: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        body = dataclasses.asdict(self)  # type: ignore[call-overload]  # every subclass is a dataclass; the base is not
        return {"schema": self.SCHEMA, "schema_version": SCHEMA_VERSION, **body}

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, **kwargs)

    @classmethod
    def _check_header(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(data, Mapping):
            raise SchemaVersionError(f"expected a JSON object for {cls.SCHEMA}, got {type(data).__name__}")
        body = dict(data)
        schema = body.pop("schema", None)
        version = body.pop("schema_version", None)
        if schema != cls.SCHEMA:
            raise SchemaVersionError(f"document has schema {schema!r}, expected {cls.SCHEMA!r}")
        if version != SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{cls.SCHEMA} document has schema_version {version!r}; this TableTune reads version "
                f"{SCHEMA_VERSION} (upgrade TableTune or re-export the document)"
            )
        return body

    @classmethod
    def from_json(cls: type[T], text: str) -> T:
        try:
            # TableTune's own documents (json.dumps may have written NaN); depth, digits and
            # duplicate keys are bounded as in every reader (strict_io).
            data = strict_io.loads(text, allow_nan=True)
        except ValueError as exc:  # json.JSONDecodeError and strict_io.StrictJSONError
            raise SchemaVersionError(f"not valid JSON for {cls.SCHEMA}: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
        """Load a document; a missing, unknown or mistyped field is a ``DocumentError`` naming it."""
        body = cls._check_header(data)
        try:
            return cls._from_body(body)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, TableTuneError):
                raise
            what = f"lacks the field {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
            raise DocumentError(f"{cls.SCHEMA} document {what}; re-export it with this TableTune") from None

    @classmethod
    def _from_body(cls: type[T], body: dict[str, Any]) -> T:
        return cls(**body)
