// Command gocbcorecheck streams every vbucket of a bucket with gocbcore's own DCP agent and
// prints, per vbucket, the final state of every key (highest seqno wins; deletions,
// expirations and collection drops remove). It proves that dcp-cdc's test producer
// (dcp_cdc/simulator/server.py) speaks DCP as a real client expects it.
//
// Without -live, each vbucket streams from 0 to its high seqno at start (GetVbucketSeqnos)
// and the stream ends Ok. With -live, streams are open-ended and the program stops once
// every vbucket has reached its high seqno and the high seqnos held still for -settle.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/couchbase/gocbcore/v10"
	"github.com/couchbase/gocbcore/v10/memd"
)

type doc struct {
	CollectionID uint32 `json:"collection_id"`
	Key          []byte `json:"key"`
	SeqNo        uint64 `json:"seqno"`
	RevNo        uint64 `json:"rev_seqno"`
	Cas          uint64 `json:"cas"`
	Flags        uint32 `json:"flags"`
	Expiry       uint32 `json:"expiry"`
	Datatype     uint8  `json:"datatype"`
	Value        []byte `json:"value"`
}

type vbState struct {
	docs    map[string]doc
	last    uint64
	markers int
	items   int
	end     string
}

type observer struct {
	mu    sync.Mutex
	vbs   map[uint16]*vbState
	ended map[uint16]chan error
}

func (o *observer) vb(id uint16) *vbState {
	s := o.vbs[id]
	if s == nil {
		s = &vbState{docs: map[string]doc{}}
		o.vbs[id] = s
	}
	return s
}

func ident(cid uint32, key []byte) string { return fmt.Sprintf("%d/%x", cid, key) }

func (o *observer) seen(vb uint16, seqno uint64) *vbState {
	s := o.vb(vb)
	if seqno > s.last {
		s.last = seqno
	}
	return s
}

func (o *observer) SnapshotMarker(m gocbcore.DcpSnapshotMarker) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.vb(m.VbID).markers++
}

func (o *observer) Mutation(m gocbcore.DcpMutation) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.seen(m.VbID, m.SeqNo)
	s.items++
	id := ident(m.CollectionID, m.Key)
	if old, ok := s.docs[id]; ok && old.SeqNo > m.SeqNo {
		return
	}
	s.docs[id] = doc{m.CollectionID, append([]byte(nil), m.Key...), m.SeqNo, m.RevNo, m.Cas,
		m.Flags, m.Expiry, m.Datatype, append([]byte(nil), m.Value...)}
}

func (o *observer) remove(vb uint16, seqno uint64, cid uint32, key []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.seen(vb, seqno)
	s.items++
	id := ident(cid, key)
	if old, ok := s.docs[id]; ok && old.SeqNo < seqno {
		delete(s.docs, id)
	}
}

func (o *observer) Deletion(d gocbcore.DcpDeletion) { o.remove(d.VbID, d.SeqNo, d.CollectionID, d.Key) }
func (o *observer) Expiration(e gocbcore.DcpExpiration) {
	o.remove(e.VbID, e.SeqNo, e.CollectionID, e.Key)
}

func (o *observer) End(e gocbcore.DcpStreamEnd, err error) {
	o.mu.Lock()
	s := o.vb(e.VbID)
	if err == nil {
		s.end = "ok"
	} else {
		s.end = err.Error()
	}
	ch := o.ended[e.VbID]
	o.mu.Unlock()
	if ch != nil {
		ch <- err
	}
}

func (o *observer) CreateCollection(c gocbcore.DcpCollectionCreation) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen(c.VbID, c.SeqNo)
}

func (o *observer) DeleteCollection(c gocbcore.DcpCollectionDeletion) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.seen(c.VbID, c.SeqNo)
	for id, d := range s.docs {
		if d.CollectionID == c.CollectionID {
			delete(s.docs, id)
		}
	}
}

func (o *observer) FlushCollection(c gocbcore.DcpCollectionFlush) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.seen(c.VbID, c.SeqNo)
	for id, d := range s.docs {
		if d.CollectionID == c.CollectionID && d.SeqNo < c.SeqNo {
			delete(s.docs, id)
		}
	}
}

func (o *observer) CreateScope(c gocbcore.DcpScopeCreation) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen(c.VbID, c.SeqNo)
}

func (o *observer) DeleteScope(c gocbcore.DcpScopeDeletion) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen(c.VbID, c.SeqNo)
}

func (o *observer) ModifyCollection(c gocbcore.DcpCollectionModification) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen(c.VbID, c.SeqNo)
}

func (o *observer) OSOSnapshot(gocbcore.DcpOSOSnapshot) {}

func (o *observer) SeqNoAdvanced(a gocbcore.DcpSeqNoAdvanced) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen(a.VbID, a.SeqNo)
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "gocbcorecheck: "+format+"\n", args...)
	os.Exit(1)
}

func highSeqnos(agent *gocbcore.DCPAgent) map[uint16]uint64 {
	snap, err := agent.ConfigSnapshot()
	if err != nil {
		fail("config snapshot: %v", err)
	}
	servers, err := snap.NumServers()
	if err != nil {
		fail("servers: %v", err)
	}
	out := map[uint16]uint64{}
	for idx := 1; idx <= servers; idx++ { // the server index is 1-based
		done := make(chan error, 1)
		_, err := agent.GetVbucketSeqnos(idx, memd.VbucketStateActive, gocbcore.GetVbucketSeqnoOptions{},
			func(entries []gocbcore.VbSeqNoEntry, err error) {
				for _, e := range entries {
					out[e.VbID] = uint64(e.SeqNo)
				}
				done <- err
			})
		if err == nil {
			err = <-done
		}
		if err != nil {
			fail("GetVbucketSeqnos(%d): %v", idx, err)
		}
	}
	return out
}

func main() {
	connStr := flag.String("connstr", "", "couchbase://127.0.0.1:port,...")
	bucket := flag.String("bucket", "travel-sample", "bucket")
	user := flag.String("user", "Administrator", "user")
	password := flag.String("password", "password", "password")
	out := flag.String("out", "-", "output JSON file")
	live := flag.Bool("live", false, "open-ended streams; stop when caught up and settled")
	settle := flag.Duration("settle", time.Second, "how long the high seqnos must hold still (-live)")
	timeout := flag.Duration("timeout", 60*time.Second, "overall deadline")
	bufferSize := flag.Int("buffer", 256*1024, "connection_buffer_size (flow control)")
	flag.Parse()

	config := gocbcore.DCPAgentConfig{}
	if err := config.FromConnStr(*connStr); err != nil {
		fail("connection string: %v", err)
	}
	config.BucketName = *bucket
	config.SecurityConfig.Auth = gocbcore.PasswordAuthProvider{Username: *user, Password: *password}
	config.SecurityConfig.AuthMechanisms = []gocbcore.AuthMechanism{gocbcore.ScramSha512AuthMechanism}
	config.CompressionConfig.Enabled = true
	config.IoConfig.UseCollections = true
	config.IoConfig.UseClusterMapNotifications = true
	config.DCPConfig.UseExpiryOpcode = true
	config.DCPConfig.BufferSize = *bufferSize

	flags := memd.DcpOpenFlagProducer | memd.DcpOpenFlagIncludeXattrs | memd.DcpOpenFlagIncludeDeleteTimes
	agent, err := gocbcore.CreateDcpAgent(&config, "dcp-cdc:gocbcore-check", flags)
	if err != nil {
		fail("create agent: %v", err)
	}
	defer agent.Close()
	ready := make(chan error, 1)
	deadline := time.Now().Add(*timeout)
	if _, err := agent.WaitUntilReady(deadline, gocbcore.WaitUntilReadyOptions{},
		func(_ *gocbcore.WaitUntilReadyResult, err error) { ready <- err }); err != nil {
		fail("wait until ready: %v", err)
	}
	if err := <-ready; err != nil {
		fail("wait until ready: %v", err)
	}

	highs := highSeqnos(agent)
	obs := &observer{vbs: map[uint16]*vbState{}, ended: map[uint16]chan error{}}
	endAll := map[uint16]chan error{}
	for vb, high := range highs {
		end := high
		if *live {
			end = 0xffffffffffffffff
		} else if high == 0 {
			continue
		}
		ch := make(chan error, 1)
		obs.mu.Lock()
		obs.ended[vb] = ch
		obs.mu.Unlock()
		endAll[vb] = ch
		opened := make(chan error, 1)
		_, err := agent.OpenStream(vb, 0, 0, 0, gocbcore.SeqNo(end), 0, 0, obs, gocbcore.OpenStreamOptions{},
			func(_ []gocbcore.FailoverEntry, err error) { opened <- err })
		if err == nil {
			err = <-opened
		}
		var rb gocbcore.DCPRollbackError
		if errors.As(err, &rb) {
			fail("vbucket %d: rollback to %d from 0", vb, rb.SeqNo)
		}
		if err != nil {
			fail("open stream %d: %v", vb, err)
		}
	}

	if *live {
		stableSince := time.Now()
		for {
			if time.Now().After(deadline) {
				fail("live: not caught up before the deadline")
			}
			time.Sleep(100 * time.Millisecond)
			now := highSeqnos(agent)
			caught := true
			obs.mu.Lock()
			for vb, high := range now {
				if obs.vb(vb).last < high {
					caught = false
				}
				if highs[vb] != high {
					stableSince = time.Now()
				}
			}
			obs.mu.Unlock()
			highs = now
			if caught && time.Since(stableSince) >= *settle {
				break
			}
		}
	} else {
		for vb, ch := range endAll {
			select {
			case err := <-ch:
				if err != nil {
					fail("vbucket %d: stream ended with %v", vb, err)
				}
			case <-time.After(time.Until(deadline)):
				fail("vbucket %d: no stream end before the deadline", vb)
			}
		}
	}

	result := map[string]interface{}{}
	vbs := map[string]interface{}{}
	obs.mu.Lock()
	for vb, high := range highs {
		s := obs.vb(vb)
		docs := make([]doc, 0, len(s.docs))
		for _, d := range s.docs {
			docs = append(docs, d)
		}
		vbs[fmt.Sprint(vb)] = map[string]interface{}{
			"high_seqno": high, "last_seqno": s.last, "markers": s.markers, "items": s.items,
			"end": s.end, "docs": docs,
		}
	}
	obs.mu.Unlock()
	result["vbuckets"] = vbs
	data, err := json.Marshal(result)
	if err != nil {
		fail("json: %v", err)
	}
	if *out == "-" {
		_, _ = os.Stdout.Write(data)
		return
	}
	if err := os.WriteFile(*out, data, 0o644); err != nil {
		fail("write %s: %v", *out, err)
	}
}
