"""The capture agent: a DCP consumer that records a Couchbase bucket's changes into capture files."""
