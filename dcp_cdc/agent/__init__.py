"""The capture agent. Sans-I/O protocol: the DCP consumer's streams (:mod:`.consumer`), its
handshake (:mod:`.handshake`), the events it yields (:mod:`.consumer_events`) and its wire
layouts (:mod:`.consumer_wire`). Around it: one node's socket, session files and tasks
(:mod:`.node`) and its TLS (:mod:`.tls`), which vbucket streams where (:mod:`.placement`), the run's settings and
summary (:mod:`.settings`) and the entry (:mod:`.driver`). Shared: the cluster map and
connection string (:mod:`.cluster`), per-vbucket resume positions (:mod:`.positions`) and
the durable capture writer (:mod:`.writer`)."""
