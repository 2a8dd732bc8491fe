"""Bronze: capture files into ``bronze.<bucket>_events``, exactly once per frame."""
