"""The capture agent: a sans-I/O DCP consumer core (:mod:`.consumer`), the cluster map and
connection string (:mod:`.cluster`), per-vbucket resume positions (:mod:`.positions`), the
durable capture writer (:mod:`.writer`) and the asyncio driver (:mod:`.driver`)."""
