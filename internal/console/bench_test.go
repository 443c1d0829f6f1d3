package console

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// BenchmarkReviewFirstPage10k renders the first page of a queue of 10,000
// open items (the goal: under 200 ms), for a reviewer, from the view alone.
func BenchmarkReviewFirstPage10k(b *testing.B) {
	set, err := topicspec.Load("")
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(Config{Listen: "127.0.0.1:0", StateDir: b.TempDir(), Kafka: []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")}, Topics: set,
		Users: &Users{}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	defer s.view.close()
	now := time.Now()
	owners := []string{"ai_product", "security", "operations", "billing"}
	for i := 0; i < 10_000; i += 1000 {
		bt := s.view.batch()
		for j := i; j < i+1000; j++ {
			task := fmt.Sprintf("task-%05d", j)
			if _, err := s.updateItem(bt, task, func(it *reviewItem) {
				it.OpenedAt, it.SLAMs = now.Add(-time.Duration(j)*time.Second), 3_600_000
				it.Owner, it.Class, it.Reason = owners[j%len(owners)], "MODEL_REFUSAL", "refused"
			}); err != nil {
				b.Fatal(err)
			}
		}
		if err := bt.commit(); err != nil {
			b.Fatal(err)
		}
	}
	p := &person{Name: "rita", Roles: []string{RoleReviewer}, Owners: []string{"*"}}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w := httptest.NewRecorder()
		if err := s.reviewPage(w, httptest.NewRequest(http.MethodGet, "/review", nil), p); err != nil || w.Code != http.StatusOK {
			b.Fatalf("%d %v", w.Code, err)
		}
	}
}
