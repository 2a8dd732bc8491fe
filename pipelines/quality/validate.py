"""Great Expectations wiring: the suites as GE expectation suites over the metric frames.

One ephemeral GE context per run (nothing of GE's own is kept between runs; results go to
``quality.<bucket>_results``), a pandas data source with one dataframe asset per suite (the
metric frames are a few hundred rows, collected), one validation definition per suite, and
a Data Docs site written to a folder with GE's views (:mod:`pipelines.quality.data_docs`:
their templates compiled once per process). GE is imported here only (and by the views, which
it loads): it takes seconds to import (:func:`import_soon` starts that while the metric frames
are computed).
"""

from __future__ import annotations

import datetime as dt
import importlib
import logging
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dcp_cdc.errors import DcpError
from pipelines.quality.suites import SUITES, Check

if TYPE_CHECKING:
    import pandas as pd

GX_SEVERITY = {"error": "critical", "warn": "warning"}


def import_soon() -> None:
    """Import Great Expectations in a thread, while the caller waits on Spark: a fresh
    process would otherwise pay its seconds of import after the metric frames. A later
    ``import`` waits for this one (the import lock) and raises what it raised."""
    if "great_expectations" in sys.modules:
        return
    threading.Thread(
        target=importlib.import_module, args=("great_expectations",), daemon=True
    ).start()


def validate(
    frames: Mapping[str, pd.DataFrame],
    checks: tuple[Check, ...],
    *,
    docs_dir: Path,
    run_name: str,
    run_time: dt.datetime,
    max_examples: int,
) -> dict[str, dict[str, Any]]:
    """Validate each suite's metric frame; returns every check's result by ``check.key``, as
    GE serializes it (``ExpectationValidationResult.to_json_dict()``), and builds Data Docs
    into ``docs_dir``."""
    import great_expectations as gx
    from great_expectations.core.expectation_suite import ExpectationSuite
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    from pipelines.quality import data_docs

    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    context = gx.get_context(
        mode="ephemeral",
        project_config=DataContextConfig(
            store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
            analytics_enabled=False,
            progress_bars=ProgressBarsConfig(globally=False),
        ),
    )
    site: dict[str, Any] = {
        "class_name": "SiteBuilder",
        "store_backend": {
            "class_name": "TupleFilesystemStoreBackend",
            "base_directory": str(docs_dir),
        },
        **data_docs.views(),  # GE's views, their templates compiled once per process
    }
    # GE's type of a site's settings lists only some of those it takes (not the sections')
    context.add_data_docs_site("dcp_cdc", site)  # type: ignore[arg-type]
    # The metric frames are small and local: GE's pandas engine (its Spark engine ran
    # several Spark jobs per expectation over them).
    source = context.data_sources.add_pandas(name="dcp_cdc_quality")
    run_id = RunIdentifier(run_name=run_name, run_time=run_time)
    out: dict[str, dict[str, Any]] = {}
    for suite in SUITES:
        mine = [c for c in checks if c.suite == suite.name]
        expectations = [
            getattr(gx.expectations, c.expectation)(
                **c.kwargs,
                severity=GX_SEVERITY[c.severity],
                description=f"{c.name} ({c.severity}): {c.description}",
                meta={"check": c.key, "severity": c.severity},
            )
            for c in mine
        ]
        gx_suite = context.suites.add(
            ExpectationSuite(
                name=suite.name,
                expectations=expectations,
                meta={"description": suite.description, "entity": suite.entity},
            )
        )
        batch = source.add_dataframe_asset(name=suite.name).add_batch_definition_whole_dataframe(
            "metrics"
        )
        definition = context.validation_definitions.add(
            gx.ValidationDefinition(name=suite.name, data=batch, suite=gx_suite)
        )
        details = sorted({c.detail for c in mine if c.detail})
        result = definition.run(
            batch_parameters={"dataframe": frames[suite.name]},
            result_format={
                "result_format": "SUMMARY",
                "unexpected_index_column_names": ["where", *details],
                "partial_unexpected_count": max_examples,
            },
            run_id=run_id,
        )
        for r in result.results:
            meta = r.expectation_config.meta if r.expectation_config else None
            if not meta or "check" not in meta:
                raise DcpError(f"suite {suite.name}: a result without its check: {r}")
            data: dict[str, Any] = r.to_json_dict()
            out[str(meta["check"])] = data
    missing = sorted({c.key for c in checks} - set(out))
    if missing:
        raise DcpError(f"Great Expectations returned no result for {missing}")
    context.build_data_docs()
    return out
