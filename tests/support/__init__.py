"""What tests share and are not tests themselves: the truth comparison of silver, harnesses that
run the producer, the capture agent and killed jobs, test oracles (a naive DCP consumer, a pure
Snappy reader), the decoder fuzzer, Hypothesis strategies, a hand-written sample session,
throw-away TLS certificates and a delta-rs reader."""
