"""The prometheus-operator CRD schemas (vendored, tests/fixtures/schemas) as `kubectl apply --validate=strict`
applies them."""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft7Validator

from testkit.paths import FIXTURES

CRDS = FIXTURES / "schemas" / "prometheus-operator"


def strict(schema: Any) -> Any:
    """Unknown fields are errors (the API server would otherwise prune them silently), except where the CRD
    preserves unknown fields."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out \
                and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    return [strict(v) for v in schema] if isinstance(schema, list) else schema


def crd_validator(plural: str) -> Draft7Validator:
    """The strict validator of `<plural>.v1.schema.json` (podmonitors, servicemonitors, prometheusrules)."""
    return Draft7Validator(strict(json.loads((CRDS / f"{plural}.v1.schema.json").read_text())))
