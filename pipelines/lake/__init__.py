"""The lake platform every job stands on: the Spark session, Delta I/O habits, object storage, the code shipped to executors, fault points."""
