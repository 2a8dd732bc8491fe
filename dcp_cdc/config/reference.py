"""The configuration reference, generated from the models' field docstrings.

``python -m dcp_cdc.config.reference --update docs/configuration.md`` regenerates the
reference between the markers of ``docs/configuration.md`` (a unit test keeps it up to date);
``--markdown`` prints it.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path
from types import UnionType
from typing import Literal, Union, get_args, get_origin

from pydantic.fields import FieldInfo

from dcp_cdc.config.base import ConfigModel
from dcp_cdc.config.loader import AppConfig
from dcp_cdc.errors import ConfigError


def _type_name(annotation: object) -> str:
    """A reader's name for a field's type: ``int``, ``archive | drop``, ``table``, ..."""
    origin = get_origin(annotation)
    if origin is Literal:
        return " \\| ".join(str(arg) for arg in get_args(annotation))
    if origin is dict:
        return "table"
    if origin is list:
        return "array"
    if origin in (UnionType, Union):
        names = [_type_name(arg) for arg in get_args(annotation) if arg is not type(None)]
        return " \\| ".join(names)
    plain: dict[object, str] = {
        str: "string",
        int: "integer",
        float: "number",
        bool: "boolean",
        dt.date: "date",
    }
    return plain.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _toml_value(value: object) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
        unit, size = ("GiB", value >> 30) if value % (1 << 30) == 0 else ("MiB", value >> 20)
        return f"`{value}` ({size} {unit})"
    if isinstance(value, dict):
        return "<br>".join(f'`"{k}" = "{v}"`' for k, v in value.items()) or "`{}`"
    return f"`{value}`"


def _prose(text: str | None) -> str:
    """A docstring as one Markdown line: reST ``literals`` become `code`, pipes are escaped."""
    return " ".join((text or "").split()).replace("``", "`").replace("|", "\\|")


def _bounds(info: FieldInfo) -> str:
    """`` (≥ 0)``, `` (65536 – 1073741824)``: the limits a field's value must keep."""
    low = next((m.ge for m in info.metadata if hasattr(m, "ge")), None)
    high = next((m.le for m in info.metadata if hasattr(m, "le")), None)
    if low is not None and high is not None:
        return f" ({low} – {high})"
    return f" (≥ {low})" if low is not None else ""


def _table_model(annotation: object) -> type[ConfigModel] | None:
    """The model of an optional table (``CaptureConfig | None``); None for anything else."""
    if get_origin(annotation) in (UnionType, Union):
        models = [
            a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, ConfigModel)
        ]
        return models[0] if len(models) == 1 else None
    return None


def _list_model(annotation: object) -> type[ConfigModel] | None:
    """The model of an array of tables (``list[ProjectionConfig]``); None for anything else."""
    item = get_args(annotation)[0] if get_origin(annotation) is list else None
    return item if isinstance(item, type) and issubclass(item, ConfigModel) else None


def _rows(model: type[ConfigModel], prefix: str) -> list[str]:
    rows = []
    for name, info in model.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, ConfigModel):
            continue  # a section of its own
        default = (
            "required"
            if info.is_required()
            else _toml_value(info.get_default(call_default_factory=True))
        )
        annotation = info.annotation
        item = get_args(annotation)[0] if get_origin(annotation) is list else None
        if isinstance(item, type) and issubclass(item, ConfigModel):
            for sub, sub_info in item.model_fields.items():
                sub_default = (
                    "required"
                    if sub_info.is_required()
                    else _toml_value(sub_info.get_default(call_default_factory=True))
                )
                kind = (
                    "table"
                    if _table_model(sub_info.annotation)
                    else _type_name(sub_info.annotation)
                )
                rows.append(
                    f"| `[[{name}]] {sub}` | {kind}{_bounds(sub_info)} "
                    f"| {sub_default} "
                    f"| {_prose(sub_info.description)} |"
                )
            continue
        rows.append(
            f"| `{prefix}{name}` | {_type_name(annotation)}{_bounds(info)} | {default} "
            f"| {_prose(info.description)} |"
        )
    return rows


def reference_markdown() -> str:
    """The configuration reference, generated from the models (docs/configuration.md holds a
    copy)."""
    head = ["| key | type | default | meaning |", "|---|---|---|---|"]
    lines = [*head, *_rows(AppConfig, "")]
    for name, info in AppConfig.model_fields.items():
        item = get_args(info.annotation)[0] if get_origin(info.annotation) is list else None
        if isinstance(item, type) and issubclass(item, ConfigModel):
            for sub, sub_info in item.model_fields.items():
                table = _table_model(sub_info.annotation)
                if table is not None:
                    lines += ["", f"`[{name}.{sub}]` — {_prose(table.__doc__)}", "", *head]
                    lines += _rows(table, "")
                listed = _list_model(sub_info.annotation)
                if listed is not None:
                    lines += ["", f"`[[{name}.{sub}]]` — {_prose(listed.__doc__)}", "", *head]
                    lines += _rows(listed, "")
    for name, info in AppConfig.model_fields.items():
        section = info.annotation
        if isinstance(section, type) and issubclass(section, ConfigModel):
            lines += ["", f"`[{name}]` — {_prose(section.__doc__)}", "", *head]
            lines += _rows(section, "")
    return "\n".join(lines) + "\n"


REFERENCE_MARKERS = ("<!-- config-reference:start -->\n", "<!-- config-reference:end -->")
"""Where the reference goes in the file that holds it (``docs/configuration.md``)."""


def with_reference(text: str) -> str:
    """``text`` (``docs/configuration.md``) with the lines between its reference markers
    regenerated."""
    start, end = REFERENCE_MARKERS
    if start not in text or end not in text:
        raise ConfigError(f"expected the markers {start.strip()} and {end} in the file")
    head, rest = text.split(start, 1)
    return head + start + reference_markdown() + end + rest.split(end, 1)[1]


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m dcp_cdc.config.reference",
        description="Print the configuration reference, or regenerate it in a file.",
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--markdown", action="store_true", help="print the reference")
    group.add_argument(
        "--update", metavar="FILE", help="regenerate the reference in FILE (docs/configuration.md)"
    )
    args = parser.parse_args(argv)
    try:
        if args.markdown:
            print(reference_markdown(), end="")
        else:
            page = Path(args.update)
            page.write_text(with_reference(page.read_text(encoding="utf-8")), encoding="utf-8")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
