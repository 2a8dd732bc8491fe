"""Configuration: pydantic models (frozen, ``extra="forbid"``) and the one loader.

Every name below is importable from here (``from dcp_cdc.config import AppConfig``); the
modules of the package hold them by concern (docs/architecture.md names each).
"""

from __future__ import annotations

from dcp_cdc.config.base import ConfigModel
from dcp_cdc.config.capture import CaptureConfig, CaptureDirs
from dcp_cdc.config.loader import (
    CONFIG_ENV,
    CONFIG_RULE,
    DEFAULT_WORKDIR,
    DEMO_BUCKET,
    LOCAL_CONFIG,
    LOOPBACK_NAMES,
    PROJECTION_RESERVED,
    PROJECTION_TYPES,
    AirflowConfig,
    AppConfig,
    BucketConfig,
    FollowConfig,
    IngestConfig,
    MaintenanceConfig,
    MetastoreAddress,
    ProjectionColumn,
    ProjectionConfig,
    PushgatewayConfig,
    QualityConfig,
    Severity,
    SilverConfig,
    SparkConfig,
    TableConfig,
    ThriftConfig,
    builtin_settings,
    find_config,
    is_loopback,
    is_uri,
    load_config,
    main,
    metastore_address,
    thrift_settings,
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
