"""``pip install celery_agboss[stripe]`` brings exactly the Stripe SDK, and so on.

Read from the installed distribution's metadata (what pip resolves an extra from),
so a typo in setup.cfg or an SDK added to the wrong extra fails here.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re

import pytest

GATEWAY_EXTRAS = {
    "stripe": ("stripe", "stripe"),
    "checkout": ("checkout-sdk", "checkout_sdk"),
    "adyen": ("adyen", "Adyen"),
    "paypal": ("paypal-server-sdk", "paypalserversdk"),
}


def _requirements_of(extra: str) -> set[str]:
    found = set()
    for requirement in importlib.metadata.requires("celery_agboss") or []:
        if re.search(rf"""extra\s*==\s*["']{re.escape(extra)}["']""", requirement):
            name = re.split(r"[\s;<>=!~\[]", requirement, maxsplit=1)[0]
            found.add(name.lower().replace("_", "-"))
    return found


@pytest.mark.parametrize("extra", sorted(GATEWAY_EXTRAS))
def test_each_gateway_extra_brings_exactly_its_sdk(extra: str) -> None:
    distribution, _ = GATEWAY_EXTRAS[extra]
    assert _requirements_of(extra) == {distribution}


@pytest.mark.parametrize("extra", sorted(GATEWAY_EXTRAS))
def test_each_gateway_sdk_is_bounded_to_the_major_version_it_was_tested_with(
    extra: str,
) -> None:
    """An SDK's next major may rename the exceptions the adapter's verdicts read."""
    lines = [
        r for r in importlib.metadata.requires("celery_agboss") or [] if f'extra == "{extra}"' in r
    ]
    assert len(lines) == 1 and ">=" in lines[0] and "<" in lines[0].replace("<=", ""), lines


@pytest.mark.parametrize("extra", sorted(GATEWAY_EXTRAS))
def test_the_adapter_module_imports_with_its_sdk(extra: str) -> None:
    _, module = GATEWAY_EXTRAS[extra]
    importlib.import_module(module)
    importlib.import_module(f"celery_agboss.adapters.{extra}")


def test_the_adapters_package_imports_no_sdk() -> None:
    """Installing one extra must not make ``import celery_agboss.adapters`` need the others."""
    import subprocess
    import sys

    code = (
        "import sys, celery_agboss.adapters, celery_agboss.adapters.common; "
        "loaded = [m for m in ('stripe', 'checkout_sdk', 'Adyen', 'paypalserversdk') "
        "if m in sys.modules]; print(','.join(loaded))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("extra", sorted(GATEWAY_EXTRAS))
def test_an_adapter_without_its_sdk_says_which_extra_to_install(extra: str) -> None:
    import subprocess
    import sys

    _, module = GATEWAY_EXTRAS[extra]
    code = (
        f"import sys; sys.modules[{module!r}] = None\n"
        "try:\n"
        f"    import celery_agboss.adapters.{extra}\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert f"pip install 'celery_agboss[{extra}]'" in out.stdout, out.stdout + out.stderr
