"""The command line's faces of the jobs: one module per verb that runs a job.

Each module has ``add_arguments(parser)`` (the verb's own flags; ``--config`` and ``--bucket``
are declared once in :mod:`pipelines.cli`) and ``command(args, out) -> exit status``, which
imports its job module only when the verb runs. These modules import neither pyspark nor a
job module at the top, so ``dcp-cdc --help`` and the Spark-free verbs start no Spark, while the
job modules themselves import pyspark at the top like any PySpark code.
"""
