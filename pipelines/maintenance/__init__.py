"""Maintenance of a bucket's tables (OPTIMIZE, VACUUM, tombstone purge, quality retention)."""
