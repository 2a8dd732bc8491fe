"""The application above the jobs: the ``dcp-cdc`` command line and its verbs, the batch run, the embedded demo, the Airflow tasks."""
