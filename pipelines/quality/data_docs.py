"""Data Docs' page views: Great Expectations' own, with their Jinja templates compiled once
per process.

GE's site builder makes a view per site section and for the index, each with a Jinja
environment of its own, so every build compiled its fifty-odd templates again: 0.4 s of a
0.5-0.6 s build of the five suites' site. These views keep the compiled code in one
in-memory bytecode cache the environments share (Jinja checks each template's source against
its checksum before it uses the code); the pages they render are GE's, byte for byte.
:func:`pipelines.quality.validate.validate` names them in the site's configuration. Imported
by GE when it builds a site, never at a job's start (GE takes seconds to import).
"""

from __future__ import annotations

from typing import Any

from great_expectations.render.view.view import DefaultJinjaIndexPageView, DefaultJinjaPageView
from jinja2.bccache import Bucket, BytecodeCache


class _InMemory(BytecodeCache):
    """Compiled templates by Jinja's key (template name and file), for the process."""

    def __init__(self) -> None:
        self._compiled: dict[str, bytes] = {}

    def load_bytecode(self, bucket: Bucket) -> None:
        compiled = self._compiled.get(bucket.key)
        if compiled is not None:
            bucket.bytecode_from_string(compiled)  # dropped again if its source changed

    def dump_bytecode(self, bucket: Bucket) -> None:
        self._compiled[bucket.key] = bucket.bytecode_to_string()

    def clear(self) -> None:
        self._compiled.clear()

    def __len__(self) -> int:
        return len(self._compiled)


COMPILED = _InMemory()
"""The templates every view of the process has compiled."""


class PageView(DefaultJinjaPageView):
    """GE's page view (suites, validation results), templates compiled once per process."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.env.bytecode_cache = COMPILED


class IndexPageView(DefaultJinjaIndexPageView):
    """GE's index page view, templates compiled once per process."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.env.bytecode_cache = COMPILED


def views() -> dict[str, Any]:
    """The site builder settings that render the site with these views."""
    page = {"view": {"module_name": __name__, "class_name": PageView.__name__}}
    return {
        "site_index_builder": {
            "class_name": "DefaultSiteIndexBuilder",
            "view": {"module_name": __name__, "class_name": IndexPageView.__name__},
        },
        "site_section_builders": {name: dict(page) for name in SECTIONS},
    }


SECTIONS = ("expectations", "validations", "profiling")
"""The sections of GE's default site (each gets its default source and renderer)."""
