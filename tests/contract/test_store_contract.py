"""The store contract suite (``celery_agboss.testing.contract``) on both backends.

Each case names the guarantee it proves; a failure message starts with it.
"""

from __future__ import annotations

import pytest

from celery_agboss.testing.contract import CONTRACT_CASES, ContractCase
from tests.contract.conftest import StoreFactory


@pytest.mark.parametrize("case", CONTRACT_CASES, ids=str)
def test_the_store_keeps_its_contract(case: ContractCase, store_factory: StoreFactory) -> None:
    case.check(store_factory)
