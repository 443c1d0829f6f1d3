package event

import (
	"strconv"
	"unicode/utf8"
)

// Redrive is the lineage of a re-driven record (the faultrouter.redrive.*
// headers, read and written by pkg/codec): an operator's instruction to
// route an event afresh.
type Redrive struct {
	SourceTopic     string
	SourcePartition int32
	SourceOffset    int64
	// Count is the number of re-drives of this lineage, 1 for the first.
	Count int
	// Reason is the operator's reason; Forced is set when the operator
	// overrode the guard against re-driving a write whose outcome is
	// unknown.
	Reason string
	Forced bool
	// Operator is who re-drove the record, when known.
	Operator string
}

// Source names the re-driven record: topic/partition@offset.
func (r *Redrive) Source() string {
	return r.SourceTopic + "/" + strconv.Itoa(int(r.SourcePartition)) + "@" + strconv.FormatInt(r.SourceOffset, 10)
}

// ShortReason is the operator's reason cut to at most n bytes, on a rune
// boundary.
func (r *Redrive) ShortReason(n int) string {
	s := r.Reason
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
