package lockedbuf

import (
	"strings"
	"sync"
	"testing"
)

// Guards concurrent use: writers on many goroutines and a reader at once
// lose no byte (run with -race).
func TestConcurrentWritesAndReads(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				b.Write([]byte("x"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if got := b.String(); got != strings.Repeat("x", 800) {
		t.Errorf("%d bytes, want 800", len(got))
	}
}
