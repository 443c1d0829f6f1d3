package console

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// BenchmarkReviewFirstPage10k renders the first page of a queue of 10,000
// open items (the goal: under 200 ms), for a reviewer, from the view alone.
func BenchmarkReviewFirstPage10k(b *testing.B) {
	s := workServer(b)
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
