"""``dcp-cdc status``: where each bucket's pipeline stands, on one screen.

Per bucket, four stages in pipeline order, each a seqno per vbucket: the cluster (its high
seqnos, asked of the data nodes), the capture agent (its checkpoint), bronze (the ingest
log) and silver (its stream state); how far each is behind the one before it, when each
last moved, how old silver's newest change is, and the last quality check.

The modules: :mod:`~pipelines.status.lag` (the stages and their lags: pure, no Spark),
:mod:`~pipelines.status.render` (the screen and the JSON object),
:mod:`~pipelines.status.agent_side` (the checkpoint and the cluster: no Spark),
:mod:`~pipelines.status.table_stages` (what the small tables' rows say: pure),
:mod:`~pipelines.status.tables_read` (where those tables are, read with delta-rs: no JVM),
:mod:`~pipelines.status.spark_tables` (read through the catalog, for a shared catalog's
table not at its warehouse location) and :mod:`~pipelines.status.read` (one bucket's status,
in order).
"""
