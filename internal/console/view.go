package console

// view.go is the console's read-only view: a Pebble directory of its own
// that caches what the console has read of the committed topics. It is a
// cache: an empty directory is rebuilt from the topics, and nothing in it is
// ever written back to Kafka.
//
// Key layout:
//
//	off/<topic>/<partition>            -> next offset to read (8 bytes)
//	meta/layout                        -> the version of this layout
//	rev/<task_id>                      -> reviewItem (JSON)
//	open/<task_id>                     -> marker: the item is open
//	q/<due:16 hex>/<task_id>           -> queueEntry (owner NUL class NUL template NUL decided): an open item by due time
//	cls/<closed:16 hex>/<task_id>      -> marker: a closed item by closing time
//	orp/<decided:16 hex>/<task_id>     -> marker: decisions for a task without an item, by decision time (retention.go)
//	brk/<scope>/<key>                  -> breakerView (JSON)
//	brks/<rank>/<scope>/<key>          -> marker: the breakers in the page's order (rank 0 OPEN, 1 HALF_OPEN, 2 CLOSED)
//	dl/<time:16 hex>/<topic>/<partition>/<offset> -> deadLetter (JSON)
//	dli/<topic>/<partition>/<offset>   -> the dl/ key of that dead letter
//	alr/<time:16 hex>/<partition>/<offset> -> alert (JSON)
//	due/<task_id>                      -> pendingRetry (JSON): an audited retry not yet published
//	dueref/<scope>/<key>/<task_id>     -> its not-before (8 bytes, ms), under each breaker it goes into
//	job/<id>                           -> job (JSON): a re-drive job and who ran it
//	cost/<hour:16 hex>/<c|m|t>/<name>  -> costSums (JSON): the cost ledger of an hour by class, provider/model, template (cost.go)
//	op/<time:16 hex>/<partition>/<offset> -> opAction (JSON): an operator action
//	prog/<day:16 hex>/<user>           -> the user's decisions that day (JSON number)
//	opt/<task_id>/<time>/<partition>/<offset> -> opAction of one task
//	nq/<task_id>                       -> marker: a high-priority item opened, to notify (notify.go)
//	ntf/<notice>/<task_id>/<opened:16 hex> -> marker: the webhook notice of that opening was sent

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"

	"github.com/faultrouter/faultrouter/internal/store"
)

// view is the Pebble-backed cache of the topics.
type view struct {
	db *pebble.DB
	// reads counts the keys the pages read (a get, or a key an iteration
	// visits): the work of a page, which its tests bound
	reads atomic.Int64
}

func openView(dir string, log *slog.Logger) (*view, error) {
	db, err := pebble.Open(dir, &pebble.Options{Logger: store.PebbleLogger(log.With("component", "pebble")), FormatMajorVersion: pebble.FormatNewest})
	if err != nil {
		return nil, fmt.Errorf("console: open the view in %s: %w", dir, err)
	}
	v := &view{db: db}
	if err := v.checkLayout(log); err != nil {
		db.Close()
		return nil, err
	}
	return v, nil
}

// viewLayout is the version of the key layout; a view of another layout
// (or of none) is emptied and rebuilt from the topics.
const viewLayout = "4"

func (v *view) checkLayout(log *slog.Logger) error {
	b, closer, err := v.db.Get([]byte("meta/layout"))
	if err == nil {
		same := string(b) == viewLayout
		closer.Close()
		if same {
			return nil
		}
	} else if !errors.Is(err, pebble.ErrNotFound) {
		return err
	}
	it, err := v.db.NewIter(nil)
	if err != nil {
		return err
	}
	empty := !it.First()
	it.Close()
	if !empty {
		log.Info("console: the view has another key layout: emptied, it is rebuilt from the topics")
		if err := v.db.DeleteRange([]byte{0}, []byte{0xff}, pebble.Sync); err != nil {
			return err
		}
	}
	return v.db.Set([]byte("meta/layout"), []byte(viewLayout), pebble.Sync)
}

func (v *view) close() error { return v.db.Close() }

// get decodes the JSON value of key into out; false when there is none.
func (v *view) get(key string, out any) (bool, error) {
	v.reads.Add(1)
	b, closer, err := v.db.Get([]byte(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer closer.Close()
	return true, json.Unmarshal(b, out)
}

// has reports whether key is in the view.
func (v *view) has(key string) bool {
	_, closer, err := v.db.Get([]byte(key))
	if err != nil {
		return false
	}
	closer.Close()
	return true
}

// each calls fn with the key and value of every key under prefix, in key
// order (reverse with desc), until fn returns false.
func (v *view) each(prefix string, desc bool, fn func(key string, val []byte) bool) error {
	it, err := v.db.NewIter(&pebble.IterOptions{LowerBound: []byte(prefix), UpperBound: upper(prefix)})
	if err != nil {
		return err
	}
	defer it.Close()
	valid := it.First
	next := it.Next
	if desc {
		valid, next = it.Last, it.Prev
	}
	for ok := valid(); ok; ok = next() {
		v.reads.Add(1)
		if !fn(string(it.Key()), it.Value()) {
			break
		}
	}
	return it.Error()
}

// eachRange is each over the keys in [lo, hi).
func (v *view) eachRange(lo, hi string, desc bool, fn func(key string, val []byte) bool) error {
	it, err := v.db.NewIter(&pebble.IterOptions{LowerBound: []byte(lo), UpperBound: []byte(hi)})
	if err != nil {
		return err
	}
	defer it.Close()
	valid, next := it.First, it.Next
	if desc {
		valid, next = it.Last, it.Prev
	}
	for ok := valid(); ok; ok = next() {
		v.reads.Add(1)
		if !fn(string(it.Key()), it.Value()) {
			break
		}
	}
	return it.Error()
}

// upper is the smallest key above every key starting with prefix.
func upper(prefix string) []byte {
	b := []byte(prefix)
	return append(b[:len(b)-1:len(b)-1], b[len(b)-1]+1)
}

// offsets returns the next offset to read of every partition read so far.
func (v *view) offsets() (map[string]map[int32]int64, error) {
	out := map[string]map[int32]int64{}
	err := v.each("off/", false, func(k string, val []byte) bool {
		rest := strings.TrimPrefix(k, "off/")
		i := strings.LastIndexByte(rest, '/')
		p, err := strconv.Atoi(rest[i+1:])
		if err != nil || len(val) != 8 {
			return true
		}
		t := rest[:i]
		if out[t] == nil {
			out[t] = map[int32]int64{}
		}
		out[t][int32(p)] = int64(binary.BigEndian.Uint64(val))
		return true
	})
	return out, err
}

// batch is one poll's writes: the view changes and the offsets, together.
type batch struct {
	b *pebble.Batch
	v *view
}

func (v *view) batch() *batch { return &batch{b: v.db.NewIndexedBatch(), v: v} }

func (b *batch) put(key string, val any) error {
	j, err := json.Marshal(val)
	if err != nil {
		return err
	}
	return b.b.Set([]byte(key), j, nil)
}

func (b *batch) del(key string) error { return b.b.Delete([]byte(key), nil) }

// add adds n to the count under key (0 when absent).
func (b *batch) add(key string, n int) error {
	var c int
	if _, err := b.get(key, &c); err != nil {
		return err
	}
	return b.put(key, c+n)
}

// get reads key as the batch would leave it: an indexed batch reads through
// to the database, and a key it deletes is not found. A nil out only asks
// whether the key is there.
func (b *batch) get(key string, out any) (bool, error) {
	val, closer, err := b.b.Get([]byte(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer closer.Close()
	if out == nil {
		return true, nil
	}
	return true, json.Unmarshal(val, out)
}

func (b *batch) offset(topic string, partition int32, next int64) error {
	var val [8]byte
	binary.BigEndian.PutUint64(val[:], uint64(next))
	return b.b.Set([]byte(fmt.Sprintf("off/%s/%d", topic, partition)), val[:], nil)
}

// commit writes the batch without fsync: the topics are the durable copy.
func (b *batch) commit() error { return b.b.Commit(pebble.NoSync) }

// timeKey is a fixed-width hex millisecond time, so that keys sort by time.
func timeKey(ms int64) string { return fmt.Sprintf("%016x", uint64(ms)) }
