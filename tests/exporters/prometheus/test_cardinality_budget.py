"""The cardinality budget (docs/cardinality.md): series per pod, measured from the agent's real exposition for
each configuration, may not grow more than 10 % over the committed table.

After an intended change, measure again and commit both files:

    KVSCOPE_REGEN_BUDGET=1 .venv/bin/pytest tests/exporters/prometheus/test_cardinality_budget.py
    git diff docs/cardinality.md docs/cardinality.json
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

from testkit import cardinality as card

REGEN = os.environ.get("KVSCOPE_REGEN_BUDGET") == "1"
MEASURED: dict[str, Counter[str]] = {}


@pytest.mark.parametrize("config", card.CONFIGURATIONS, ids=lambda c: c.key)
def test_series_per_pod_within_the_budget(config: card.Configuration) -> None:
    counts = MEASURED[config.key] = card.measure(config)
    measured = sum(counts.values())
    if REGEN:
        return
    row = card.budget()["rows"][config.key]
    allowed = row["series"] * (1 + card.GROWTH_ALLOWED)
    assert measured <= allowed, (
        f"{config.key}: {measured} series per pod, the budget says {row['series']} (+10 % = {allowed:.0f}); "
        f"by group now {card.grouped(counts)}, budgeted {row['groups']}. If intended, regenerate the "
        "budget (this file's docstring) and say why in docs/cardinality.md")


def test_the_budget_document_shows_the_machine_readable_budget() -> None:
    if REGEN:
        assert set(MEASURED) == {c.key for c in card.CONFIGURATIONS}, "regenerate with every configuration"
        rows = card.budget_rows(MEASURED)
        card.BUDGET.write_text(json.dumps({"growth_allowed": card.GROWTH_ALLOWED, "rows": rows}, indent=2) + "\n")
        doc = card.BUDGET_DOC.read_text()
        head, rest = doc.split(card.TABLE_START, 1)
        _, tail = rest.split(card.TABLE_END, 1)
        card.BUDGET_DOC.write_text(head + card.TABLE_START + card.markdown_table(rows) + card.TABLE_END + tail)
    budget = card.budget()
    assert list(budget["rows"]) == [c.key for c in card.CONFIGURATIONS]
    assert card.markdown_table(budget["rows"]) in card.BUDGET_DOC.read_text()
