package emit

import "github.com/twmb/franz-go/pkg/kgo"

// arenaBlock is the smallest block an Arena allocates.
const arenaBlock = 256 << 10

// Arena allocates the records a batch produces (audit, routed and changelog
// records) and their encoded values from a few large blocks, reused batch
// after batch: a batch of thousands of records otherwise allocates two
// objects per record, and most of the bytes the garbage collector chases.
//
// What an arena hands out is valid until the batch is reset, and a batch is
// reset only once Kafka and Pebble are done with it: its transaction ended
// (the producer's flush returned every record) and its states were written
// (waitWritten). A batch of a failed session is dropped, not reset.
type Arena struct {
	buf  []byte       // the block values are cut from: buf[len(buf):cap(buf)] is free
	recs []kgo.Record // the block records are taken from, likewise
	// used are the bytes and records handed out since the last reset; more
	// than one block of either means the next first block is made that large
	used, usedRecs int
	blocks         int
	recBlocks      int
}

// Bytes returns an empty slice with room for n bytes. An append past n
// moves the value out of the arena, so n is a size hint, not a bound.
func (a *Arena) Bytes(n int) []byte {
	a.used += n
	if cap(a.buf)-len(a.buf) < n {
		a.buf = make([]byte, 0, max(arenaBlock, n, a.used))
		a.blocks++
	}
	l := len(a.buf)
	a.buf = a.buf[:l+n]
	return a.buf[l : l : l+n]
}

// Record returns a zero record.
func (a *Arena) Record() *kgo.Record {
	a.usedRecs++
	if len(a.recs) == cap(a.recs) {
		a.recs = make([]kgo.Record, 0, max(1024, a.usedRecs))
		a.recBlocks++
	}
	a.recs = a.recs[:len(a.recs)+1]
	return &a.recs[len(a.recs)-1]
}

// Reset makes the arena's memory free again. A batch that needed more than
// one block lets them go; the next gets one block the size of all of them
// and half as much again, so that batches of about the same size reuse it.
// A block more than four times what the batch used is let go too: the
// batches of a backlog drain are larger than those after it (batchsize.go),
// and a router that caught up should not keep their memory.
func (a *Arena) Reset() {
	if a.blocks > 1 || cap(a.buf) > 4*max(a.used, arenaBlock) {
		a.buf = make([]byte, 0, max(arenaBlock, a.used+a.used/2))
	}
	a.buf = a.buf[:0]
	if a.recBlocks > 1 || cap(a.recs) > 4*max(a.usedRecs, 1024) {
		a.recs = make([]kgo.Record, 0, max(1024, a.usedRecs+a.usedRecs/2))
	}
	clear(a.recs)
	a.recs = a.recs[:0]
	a.used, a.usedRecs, a.blocks, a.recBlocks = 0, 0, min(a.blocks, 1), min(a.recBlocks, 1)
}
