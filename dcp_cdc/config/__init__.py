"""Configuration: pydantic models (frozen, ``extra="forbid"``) and the one loader.

Every name below is importable from here (``from dcp_cdc.config import AppConfig``); the
package's modules hold them by concern:

- :mod:`~dcp_cdc.config.loader`: :class:`AppConfig`, the root, and :func:`load_config`;
- :mod:`~dcp_cdc.config.buckets`: a bucket (``[[buckets]]``) and its typed views;
- :mod:`~dcp_cdc.config.capture`: its capture agent (``[buckets.capture]``);
- :mod:`~dcp_cdc.config.jobs`: ingest, tables, silver, quality, maintenance;
- :mod:`~dcp_cdc.config.running`: follow mode, Airflow, the Pushgateway;
- :mod:`~dcp_cdc.config.spark`: Spark sessions, the metastore, the Thrift server;
- :mod:`~dcp_cdc.config.storage`: ``[storage]`` and the Delta log stores;
- :mod:`~dcp_cdc.config.base`: what every model is; :mod:`~dcp_cdc.config.reference`: the
  reference in ``docs/configuration.md``, generated from the models' docstrings.
"""

from __future__ import annotations

from dcp_cdc.config.base import ConfigModel
from dcp_cdc.config.buckets import (
    PROJECTION_RESERVED,
    PROJECTION_TYPES,
    BucketConfig,
    ProjectionColumn,
    ProjectionConfig,
)
from dcp_cdc.config.capture import CaptureConfig, CaptureDirs
from dcp_cdc.config.jobs import (
    IngestConfig,
    MaintenanceConfig,
    QualityConfig,
    Severity,
    SilverConfig,
    TableConfig,
)
from dcp_cdc.config.loader import (
    CONFIG_ENV,
    CONFIG_RULE,
    DEFAULT_WORKDIR,
    DEMO_BUCKET,
    LOCAL_CONFIG,
    AppConfig,
    builtin_settings,
    find_config,
    is_uri,
    load_config,
    main,
    thrift_settings,
)
from dcp_cdc.config.running import AirflowConfig, FollowConfig, PushgatewayConfig
from dcp_cdc.config.spark import (
    LOOPBACK_NAMES,
    MetastoreAddress,
    SparkConfig,
    ThriftConfig,
    is_loopback,
    metastore_address,
)
from dcp_cdc.config.storage import StorageConfig

__all__ = [
    "CONFIG_ENV",
    "CONFIG_RULE",
    "DEFAULT_WORKDIR",
    "DEMO_BUCKET",
    "LOCAL_CONFIG",
    "LOOPBACK_NAMES",
    "PROJECTION_RESERVED",
    "PROJECTION_TYPES",
    "AirflowConfig",
    "AppConfig",
    "BucketConfig",
    "CaptureConfig",
    "CaptureDirs",
    "ConfigModel",
    "FollowConfig",
    "IngestConfig",
    "MaintenanceConfig",
    "MetastoreAddress",
    "ProjectionColumn",
    "ProjectionConfig",
    "PushgatewayConfig",
    "QualityConfig",
    "Severity",
    "SilverConfig",
    "SparkConfig",
    "StorageConfig",
    "TableConfig",
    "ThriftConfig",
    "builtin_settings",
    "find_config",
    "is_loopback",
    "is_uri",
    "load_config",
    "main",
    "metastore_address",
    "thrift_settings",
]
