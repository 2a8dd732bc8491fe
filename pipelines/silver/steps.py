"""The steps of a silver apply run, as :attr:`pipelines.silver.job.ApplySummary.steps` names
them: a fixed set, so that metrics may use them as a label. Spark-free, for follow mode's
metrics to import."""

STEPS = (
    "tables",
    "read_states",
    "unconsumed",
    "walk",
    "registry",
    "append",
    "compact",
    "rollbacks_drops",
    "merge",
    "history",
    "save_states",
)
