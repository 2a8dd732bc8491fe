"""What every configuration model is: a pydantic model, frozen, with ``extra="forbid"``.

Attribute docstrings become field descriptions: the configuration reference
(``docs/configuration.md``) is generated from them by :mod:`dcp_cdc.config.reference`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigModel(BaseModel):
    """The base of every configuration model (a wrong or unknown key fails validation)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
