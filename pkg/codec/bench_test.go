package codec

import "testing"

// BenchmarkEncodeTaskEvent measures the producer side with a reused buffer.
func BenchmarkEncodeTaskEvent(b *testing.B) {
	c := newCodec(b)
	e := fullEvent()
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = c.EncodeTaskEvent(buf[:0], &e); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(buf)))
}

// BenchmarkDecodeTaskEvent measures the router's decode step.
func BenchmarkDecodeTaskEvent(b *testing.B) {
	c := newCodec(b)
	e := fullEvent()
	buf, err := c.EncodeTaskEvent(nil, &e)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.DecodeTaskEvent(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncodeRouted measures the router's output step, an audit record
// of a decoded input: goavro from the Go values (the baseline), against the
// wire encoder copying the event's body from the input record.
//
//	go test -run='^$' -bench=EncodeRouted ./pkg/codec
func BenchmarkEncodeRouted(b *testing.B) {
	c := newCodec(b)
	e := fullEvent()
	in, err := c.EncodeTaskEvent(nil, &e)
	if err != nil {
		b.Fatal(err)
	}
	r := routedSamples()[0]
	r.Event = &e
	b.Run("goavro", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.encodeRoutedNative(nil, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("wire-from-input", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.EncodeRoutedFrom(nil, &r, in); err != nil {
				b.Fatal(err)
			}
		}
	})
}
