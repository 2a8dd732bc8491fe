"""A small bucket's quality check in the driver: the metric frames of
:mod:`pipelines.quality.compute` over all of bronze, from tables read with delta-rs, every
step over rows in Python with Spark's value rules (:mod:`.sql`); no Spark job."""
