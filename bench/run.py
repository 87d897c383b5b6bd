"""``make bench``: run the benchmarks and print their ratios against plain Celery.

Run as a script (``.venv/bin/python bench/run.py [--quick] [--engine-only] …``);
``--help`` lists the options. What is measured and how to read it: docs/benchmarks.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    # Run as a script, sys.path[0] is bench/ itself: replace it by the repository root
    # so that the benchmark modules import as ``bench.*`` and never shadow a library.
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != here]
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from bench.cli import main as run

    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
