package console

// retention.go: the view keeps what it shows by age. A review item decided
// (closed) more than Config.ViewRetention ago, an alert and a dead-letter
// copy older than it, and a review decision for a task that never had an
// item, are deleted from the view; an open review item is kept however old,
// because it waits for a person. The topics keep what their own retention
// says: the view is a cache of them, and a rebuild reads back only what
// they still hold (and prunes it again).

import (
	"strconv"
	"strings"
	"time"
)

// DefaultViewRetention is Config.ViewRetention when zero.
const DefaultViewRetention = 30 * 24 * time.Hour

// MinViewRetention is the shortest Config.ViewRetention accepted.
const MinViewRetention = time.Minute

// pruneEvery is how often the view is pruned: a tenth of the retention, at
// most an hour.
func pruneEvery(retention time.Duration) time.Duration { return min(retention/10, time.Hour) }

// prune deletes from the view what is older than the retention at now, and
// returns how many entries it deleted. It runs between the ingest's batches,
// so that no batch reopens an item it is deleting.
func (s *Server) prune(now time.Time) (int, error) {
	cutoff := timeKey(now.Add(-s.cfg.ViewRetention).UnixMilli())
	b := s.view.batch()
	n := 0
	// decided items, by closing time; and decisions for a task without an
	// item, by decision time
	for _, prefix := range []string{"cls/", "orp/"} {
		err := s.view.eachRange(prefix, prefix+cutoff, false, func(k string, _ []byte) bool {
			task := k[min(len(prefix)+17, len(k)):] // <prefix><time:16 hex>/<task_id>
			var it reviewItem
			ok, err := b.get("rev/"+task, &it)
			if err != nil {
				return false
			}
			// the item was reopened (its index entry is another key): keep it
			if ok && !it.open() && (prefix == "cls/" && closedKey(&it) == k || prefix == "orp/" && orphanKey(&it) == k) {
				b.del("rev/" + task)
			}
			b.del(k)
			n++
			return true
		})
		if err != nil {
			b.b.Close()
			return 0, err
		}
	}
	// alerts, by time; the reviewers' counts of the days before it
	if err := b.b.DeleteRange([]byte("alr/"), []byte("alr/"+cutoff), nil); err != nil {
		b.b.Close()
		return 0, err
	}
	if err := b.b.DeleteRange([]byte("cost/"), []byte("cost/"+timeKey(now.Add(-s.cfg.ViewRetention).Truncate(time.Hour).UnixMilli())), nil); err != nil {
		b.b.Close()
		return 0, err
	}
	if err := b.b.DeleteRange([]byte("prog/"), []byte(strings.TrimSuffix(progressKey(now.Add(-s.cfg.ViewRetention), ""), "/")), nil); err != nil {
		b.b.Close()
		return 0, err
	}
	// dead-letter copies, by time, with their index entries
	err := s.view.eachRange("dl/", "dl/"+cutoff, false, func(k string, _ []byte) bool {
		// dl/<time>/<topic>/<partition:08x>/<offset:016x>
		rest := strings.TrimPrefix(k, "dl/")
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			if d, ok := parseDLRest(rest[i+1:]); ok {
				b.del("dli/" + d.id())
			}
		}
		b.del(k)
		n++
		return true
	})
	if err != nil {
		b.b.Close()
		return 0, err
	}
	if err := b.commit(); err != nil {
		return 0, err
	}
	return n, nil
}

// parseDLRest reads <topic>/<partition:08x>/<offset:016x> of a dl/ key.
func parseDLRest(rest string) (deadLetter, bool) {
	j := strings.LastIndexByte(rest, '/')
	if j < 0 {
		return deadLetter{}, false
	}
	i := strings.LastIndexByte(rest[:j], '/')
	if i < 0 {
		return deadLetter{}, false
	}
	p, perr := strconv.ParseUint(rest[i+1:j], 16, 32)
	o, oerr := strconv.ParseUint(rest[j+1:], 16, 63)
	if perr != nil || oerr != nil {
		return deadLetter{}, false
	}
	return deadLetter{Topic: rest[:i], Partition: int32(p), Offset: int64(o)}, true
}

// orphanKey indexes a review item that holds only decisions (a decision for
// a task that had no item) by its first decision's time, so that retention
// finds it.
func orphanKey(it *reviewItem) string {
	return "orp/" + timeKey(it.Decision.At.UnixMilli()) + "/" + it.TaskID
}

// orphan reports whether the item holds only decisions.
func (it *reviewItem) orphan() bool { return it.OpenedAt.IsZero() && it.Decision != nil }
