"""Tracing as a user sets it up from docs/tracing.md, on the README's deployment.

The wheel goes into a fresh virtualenv with the page's own ``pip install`` line (its
``celery_agboss[otel]`` the built wheel); the README's ``shop.py`` gets the page's
``python`` block appended, unchanged; the README's worker (two) and beat commands run
it, exporting over OTLP/HTTP to a receiver standing in for a collector
(``OTEL_EXPORTER_OTLP_ENDPOINT``, as the page says). A whole worker is SIGKILLed while
the gateway holds its charge's answer (as in test_recovery.py); once every order is
paid once, the traces show: CLIENT spans ``agboss.outbound gateway.charge`` inside
Celery's ``run/…`` spans (not one for every order: the killed worker's last spans, still
in the SDK's batch, died with it), the held charge ``reconciled`` (an
``outbound-call.reconciled`` event inside a ``run/…`` span of a worker: the re-driven
delivery's, or the sweep's), and no exported attribute holding an idempotency key or a
business key.

Redis and SQLite only: the brokers and stores are the recovery suite's business; this
one is about what the traces show. Speed-ups: test_recovery.py's, plus
``OTEL_BSP_SCHEDULE_DELAY=200`` (the SDK exports every 0.2 s instead of 5 s).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.deployment import readme, venv
from tests.deployment.conftest import DeployFactory, venv_with_extras
from tests.deployment.deployment import SPEEDUPS, Deployment
from tests.deployment.otlp import OtlpReceiver, otlp_receiver
from tests.deployment.test_recovery import recover_a_killed_worker_under_beat
from tests.deployment.venv import DeployedVenv
from tests.support.processes import wait_until

pytestmark = [pytest.mark.worker, pytest.mark.slow, pytest.mark.redis, pytest.mark.sqlite]

TRACING_MD = Path(__file__).resolve().parents[2] / "docs" / "tracing.md"
CLIENT = 3  # SpanKind.SPAN_KIND_CLIENT in OTLP
SPANS_SECONDS = 30.0


def _page_blocks(lang: str) -> list[str]:
    blocks = readme.code_blocks(TRACING_MD.read_text(encoding="utf-8"), lang)
    assert blocks, f"docs/tracing.md has no ```{lang} block"
    return blocks


def _pip_install_line(wheel: Path) -> list[str]:
    """The page's ``pip install`` line, its ``celery_agboss[otel]`` the built wheel."""
    (line,) = [ln for ln in _page_blocks("sh")[0].splitlines() if ln.startswith("pip install")]
    argv = shlex.split(line)
    assert "celery_agboss[otel]" in argv, line
    return [f"{wheel}[otel]" if a == "celery_agboss[otel]" else a for a in argv[2:]]


@pytest.fixture(scope="session")
def otel_venv(
    tmp_path_factory: pytest.TempPathFactory, deployed_venv: DeployedVenv
) -> DeployedVenv:
    """The wheel as docs/tracing.md installs it, in a fresh virtualenv."""
    root = venv_with_extras(tmp_path_factory, deployed_venv, "otel")
    try:
        venv.run([str(root / "bin" / "pip"), "install", *_pip_install_line(deployed_venv.wheel)])
    except venv.BuildFailed as exc:
        pytest.fail(f"docs/tracing.md's pip install failed: {exc}", pytrace=False)
    return DeployedVenv(root, deployed_venv.wheel, frozenset(), frozenset())


def _ancestors(span: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> list[str]:
    names, parent = [span["name"]], span["parent_id"]
    while parent and parent in by_id:
        names.append(by_id[parent]["name"])
        parent = by_id[parent]["parent_id"]
    return names


def _outcome(span: dict[str, Any]) -> Any:
    return span["attributes"].get("agboss.outcome")


def _values(span: dict[str, Any]) -> list[str]:
    values = [str(v) for v in span["attributes"].values()]
    for event in span["events"]:
        values += [event["name"], *(str(v) for v in event["attributes"].values())]
    return values


def test_the_traces_show_a_killed_charge_reconciled_and_no_key(
    otel_venv: DeployedVenv,
    redis_url_factory: Any,
    sqlite_url: str,
    deploy: DeployFactory,
) -> None:
    with otlp_receiver() as receiver:
        speedups = {
            **SPEEDUPS,
            # OpenTelemetry's own variables, as docs/tracing.md says to set them.
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_SERVICE_NAME": "shop",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }
        deployment = deploy(redis_url_factory(), sqlite_url, speedups, venv=otel_venv)
        deployment.prepare()  # writes the README's shop.py, migrates
        shop = deployment.app_dir / "shop.py"
        (tracing_block,) = _page_blocks("python")
        shop.write_text(f"{shop.read_text(encoding='utf-8')}\n\n{tracing_block}")
        ids, held, _, _ = recover_a_killed_worker_under_beat(deployment)
        _assert_traces(receiver, deployment, ids, held)


def _assert_traces(
    receiver: OtlpReceiver, deployment: Deployment, ids: dict[int, str], held: int
) -> None:
    def charge_spans() -> dict[str, list[dict[str, Any]]]:
        found: dict[str, list[dict[str, Any]]] = {}
        for span in receiver.spans():
            if span["name"] == "agboss.outbound gateway.charge":
                found.setdefault(span["attributes"].get("agboss.execution_id"), []).append(span)
        return found

    def reconciled() -> list[dict[str, Any]]:
        return [
            span
            for span in receiver.spans()
            for event in span["events"]
            if event["name"] == "outbound-call.reconciled"
            and event["attributes"].get("agboss.execution_id") == ids[held]
        ]

    def about_the_held() -> list[str]:
        return [
            f"{s['name']} {s['attributes']} {[e['name'] for e in s['events']]}"
            for s in receiver.spans()
            if ids[held] in str(s)
        ]

    def in_a_run_span(span: dict[str, Any]) -> bool:
        by_id = {s["span_id"]: s for s in receiver.spans()}
        return any(name.startswith("run/") for name in _ancestors(span, by_id))

    def seen() -> bool:
        # A span is exported when it ends (in batches): a call's before the run span
        # around it. The killed worker's last batch died with it, so not every order
        # has its spans; the survivors' all arrive.
        sent = [c for cs in charge_spans().values() for c in cs if _outcome(c) == "sent"]
        return any(in_a_run_span(c) for c in sent) and any(map(in_a_run_span, reconciled()))

    wait_until(
        seen,
        SPANS_SECONDS,
        message=lambda: (
            f"a sent charge and the reconcile of {ids[held]}, each inside a run span; have "
            f"charges of {sorted(charge_spans())}; about the held one: {about_the_held()}"
        ),
    )
    spans = receiver.spans()
    assert {s["service"] for s in spans} == {"shop"}
    assert all(c["kind"] == CLIENT for cs in charge_spans().values() for c in cs)
    secrets = [deployment.key_of(o) for o in ids] + [f"order:{o}" for o in ids]
    leaked = [(s["name"], v) for s in spans for v in _values(s) for k in secrets if k in v]
    assert leaked == []
