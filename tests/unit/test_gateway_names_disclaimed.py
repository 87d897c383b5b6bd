"""Every document that names a payment gateway says it is named only to identify its
public API, with no affiliation or endorsement: docs/pauses.md and CHANGELOG.md named
gateways without saying so."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIPPED = {".venv", ".git", "build", "dist", "node_modules"}
GATEWAYS = re.compile(r"\b(Stripe|Adyen|PayPal|Checkout\.com|Braintree|CardCom)\b")
DISCLAIMER = re.compile(r"not affiliated|no affiliation", re.IGNORECASE)


def _documents() -> list[Path]:
    found = [
        path
        for path in ROOT.rglob("*.md")
        if not SKIPPED.intersection(path.relative_to(ROOT).parts)
    ]
    assert len(found) >= 20, f"only {len(found)} documents under {ROOT}: is this the repository?"
    return sorted(found)


@pytest.mark.parametrize("path", _documents(), ids=lambda path: str(path.relative_to(ROOT)))
def test_a_document_naming_a_gateway_disclaims_any_affiliation(path: Path) -> None:
    text = " ".join(path.read_text(encoding="utf-8").split())
    named = sorted(set(GATEWAYS.findall(text)))
    if named and DISCLAIMER.search(text) is None:
        pytest.fail(
            f"{path.relative_to(ROOT)} names {', '.join(named)} but never says it is named "
            "only to identify its public API, with no affiliation or endorsement: add that "
            "sentence (docs/gateways.md has the wording)"
        )
