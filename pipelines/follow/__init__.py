"""Follow mode (``dcp-cdc run --follow``): one Spark session that keeps silver seconds behind
the bucket.

Every ``follow.interval_s`` a micro-batch runs for each bucket: an ordinary ingest of what
landed (:func:`pipelines.bronze.job.ingest_bucket`), then, when it brought frames, an
ordinary apply (:func:`pipelines.silver.job.apply_bucket`). A micro-batch is a batch run, so
exactly-once and snapshot consistency hold as they do there, through kills and restarts too.
Alongside, the capture agent of each bucket with a ``[buckets.capture]`` section follows the
cluster in a child process (:class:`~pipelines.follow.agent.AgentProcess`), closing files at least every
``follow.rotate_seconds``.

After each micro-batch a status line per bucket says how far behind silver is: the lag (the
seqnos captured, from the agent's checkpoint, that silver has not reached yet, summed over
vbuckets), the events per second, and the age of what silver holds. Quality checks run every
``follow.check_every_s`` and on demand (``SIGUSR1``), in a thread beside the micro-batches,
reading every table as of one moment between two of them.

A stop (``SIGTERM``, ``SIGINT``) lets the current micro-batch finish, stops the agents
cleanly (files closed, checkpoint committed) and returns; a restart carries on from there.

The modules: :mod:`~pipelines.follow.entry` (the Spark session, the signals, the buckets:
a configuration's or the embedded demo's), :mod:`~pipelines.follow.loop` (the micro-batches
and checks), :mod:`~pipelines.follow.progress` (the lag and the status line) and
:mod:`~pipelines.follow.agent` (the agents' processes and their checkpoints; no Spark).
"""
