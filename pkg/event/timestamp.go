package event

import (
	"bytes"
	"fmt"
	"strconv"
	"time"
)

// Timestamp is an Avro timestamp-millis. In JSON it is an RFC 3339 string on
// output; on input an RFC 3339 string or integer milliseconds since the epoch
// are accepted.
type Timestamp struct{ time.Time }

// At returns the Timestamp of t, truncated to milliseconds.
func At(t time.Time) Timestamp { return Timestamp{t.UTC().Truncate(time.Millisecond)} }

// FromMillis returns the Timestamp ms milliseconds after the Unix epoch.
func FromMillis(ms int64) Timestamp { return Timestamp{time.UnixMilli(ms).UTC()} }

// Millis returns t in milliseconds since the Unix epoch; zero for the zero time.
func (t Timestamp) Millis() int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// MarshalJSON writes t as an RFC 3339 string with millisecond precision.
func (t Timestamp) MarshalJSON() ([]byte, error) {
	return []byte(`"` + t.UTC().Format("2006-01-02T15:04:05.000Z07:00") + `"`), nil
}

// UnmarshalJSON reads an RFC 3339 string or integer milliseconds.
func (t *Timestamp) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		s, err := strconv.Unquote(string(b))
		if err != nil {
			return fmt.Errorf("want an RFC 3339 time or integer milliseconds")
		}
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return fmt.Errorf("want an RFC 3339 time such as 2026-01-02T15:04:05Z, got %q", s)
		}
		*t = At(v)
		return nil
	}
	ms, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return fmt.Errorf("want an RFC 3339 time or integer milliseconds, got %s", b)
	}
	*t = FromMillis(ms)
	return nil
}
