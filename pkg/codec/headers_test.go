package codec

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Guards the header contract: what the router writes as faultrouter.error.*
// and faultrouter.redrive.* headers reads back the same through the one
// parser that tail, replay and the router share; a record without them
// parses as having none; the stage tells whether the value is the original
// bytes.
func TestHeadersRoundTrip(t *testing.T) {
	at := time.UnixMilli(1764400000123).UTC()
	e := ErrorInfo{Topic: "ai.tasks.ingress", Partition: 2, Offset: 41, Timestamp: at, Stage: StageValidate, Kind: "oversize", Message: "too big"}
	r := Redrive{SourceTopic: "ai.tasks.deadletter", SourcePartition: 1, SourceOffset: 7, Count: 2, Reason: "provider fixed", Forced: true}
	hs := []kgo.RecordHeader{{Key: HeaderTraceparent, Value: []byte("00-abc-def-01")}, {Key: "x-own", Value: []byte("kept")}}
	hs = AppendRedriveHeaders(e.AppendHeaders(hs), &r)

	got := ParseHeaders(hs)
	if got.Error == nil || *got.Error != e {
		t.Fatalf("error headers read back as %+v, want %+v", got.Error, e)
	}
	if got.Redrive == nil || *got.Redrive != r {
		t.Fatalf("re-drive headers read back as %+v, want %+v", got.Redrive, r)
	}
	if got.Traceparent != "00-abc-def-01" || !got.Error.Raw() || got.Redrive.Source() != "ai.tasks.deadletter/1@7" {
		t.Fatalf("parsed %+v", got)
	}
	own := WithoutContract(hs)
	if len(own) != 2 || own[1].Key != "x-own" {
		t.Fatalf("WithoutContract = %v, want the traceparent and x-own", own)
	}
	carried := Carried(hs)
	if n := len(carried); n != 1+6 {
		t.Fatalf("Carried kept %d headers, want traceparent and 6 re-drive headers: %v", n, carried)
	}

	none := ParseHeaders([]kgo.RecordHeader{{Key: "x-own", Value: []byte("1")}, {Key: HeaderRedriveCount, Value: []byte("zero")}})
	if none.Error != nil || none.Redrive != nil || none.Error.Raw() {
		t.Fatalf("a record without contract headers parsed as %+v", none)
	}
	for stage, raw := range map[string]bool{StageDecode: true, StageValidate: true, StageRoute: false, StageWrite: false} {
		if got := (&ErrorInfo{Stage: stage}).Raw(); got != raw {
			t.Errorf("stage %s: Raw() = %v, want %v", stage, got, raw)
		}
	}
}

// Guards the bound on header text: a message is cut to 4 KiB on a UTF-8
// boundary, so an error header never makes a dead-letter record too large.
func TestErrorMessageHeaderIsBounded(t *testing.T) {
	long := ""
	for len(long) < 10<<10 {
		long += "é"
	}
	hs := (&ErrorInfo{Stage: StageWrite, Kind: "too_large", Message: long}).AppendHeaders(nil)
	msg := ParseHeaders(hs).Error.Message
	if len(msg) > 4<<10 || len(msg) < 4<<10-1 || msg != Truncate(long, 4<<10) {
		t.Fatalf("message header is %d bytes, want 4 KiB cut on a rune boundary", len(msg))
	}
}
