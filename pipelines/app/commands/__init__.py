"""The command line's verbs: one module per verb (``spark-conf`` is ``spark_conf``), and
:mod:`~pipelines.app.commands.shared`, what the catalog's verbs share.

Each module has ``add_arguments(parser)`` (the verb's own flags; ``--config``, ``--bucket``
and ``--warehouse`` are declared once in :mod:`pipelines.app.cli`), ``command(args, out) -> exit
status``, and a docstring that is the verb's ``--help``. A job's verb imports its job module
inside ``command`` only, and the other verbs their heavier imports likewise: these modules
import neither pyspark nor a job module at the top, so ``dcp-cdc --help`` and the Spark-free
verbs start no Spark, while the job modules themselves import pyspark at the top like any
PySpark code.
"""
