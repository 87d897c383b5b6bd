"""``celery -A proj agboss metrics``: one Prometheus exposition, printed.

The store's gauges, read now, and the counters a worker wrote to
``agboss_metrics_dir`` (or ``PROMETHEUS_MULTIPROC_DIR``) when this process is told
where: a worker's own temporary directory is known to that worker only. For a
textfile collector, a cron check, or a look without Prometheus.

With the store down it still exits 0, unlike the other commands' 4: its exposition
says so (``agboss_store_up 0``), and a textfile collector's ``… > f.tmp && mv`` then
writes the file that alerts instead of keeping the last one, stale, saying all is well
(docs/metrics.md). A wrong configuration exits 4.
"""

from __future__ import annotations

from typing import Any

import click

from celery_agboss.cli.group import CommandOutput, agboss, json_command, open_runtime


@agboss.command()
@click.option(
    "--dir",
    "directory",
    default=None,
    metavar="PATH",
    type=click.Path(exists=True, file_okay=False),
    help="The multiprocess directory to read counters from "
    "(default: agboss_metrics_dir, else PROMETHEUS_MULTIPROC_DIR).",
)
@json_command
@click.pass_context
def metrics(ctx: click.Context, directory: str | None, as_json: bool) -> None:
    """Print the metrics once (Prometheus text; --json: every sample)."""
    from celery_agboss.metrics.exporter import (
        build_registry,
        configured_directory,
        exposition,
    )

    out = CommandOutput(as_json)
    with open_runtime(ctx, out) as runtime:
        chosen = directory if directory is not None else configured_directory(runtime)
        if not as_json:
            click.echo(exposition(runtime, directory=chosen).decode("utf-8"), nl=False)
            return
        samples: list[dict[str, Any]] = [
            {"name": sample.name, "labels": dict(sample.labels), "value": sample.value}
            for family in build_registry(runtime, chosen).collect()
            for sample in family.samples
        ]
        out.emit({"directory": chosen, "samples": samples}, "")
