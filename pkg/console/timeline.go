package console

// timeline.go: one task's story, the same as `faultrouter replay --task ID
// --timeline`: every record of the task on ingress, decisions, audit,
// retry, review, dead letter and alerts, in time order, each step with its
// decision and reason. The reviewer of a decision shows on its step.

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/faultrouter/faultrouter/pkg/replay"
)

func (s *Server) timelinePage(w http.ResponseWriter, r *http.Request, p *person) error {
	id := strings.TrimSpace(r.URL.Query().Get("id"))
	data := map[string]any{"ID": id}
	if id != "" {
		steps, err := s.timeline(r.Context(), id)
		if err != nil {
			return err
		}
		data["Steps"] = steps
		if data["Actions"], err = s.taskActions(id, 200); err != nil {
			return err
		}
		var it reviewItem
		if ok, _ := s.view.get("rev/"+id, &it); ok && !it.OpenedAt.IsZero() {
			data["Item"] = s.rowOf(&it, p, time.Now())
		}
	}
	s.render(w, r, p, "timeline", http.StatusOK, "Task timeline", "", data)
	return nil
}

// timeline reads the task's records from every topic of its story.
func (s *Server) timeline(ctx context.Context, id string) ([]replay.Step, error) {
	shortOf := map[string]string{}
	var topics []string
	for _, short := range replay.TimelineShorts {
		n := s.topic(short)
		shortOf[n] = short
		topics = append(topics, n)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	found, err := replay.Read(ctx, s.cfg.Kafka, s.codec, topics, replay.ReadOptions{Filter: replay.Filter{Task: id}, ShortOf: shortOf, Idle: 10 * time.Second})
	if err != nil {
		return nil, err
	}
	steps := make([]replay.Step, len(found))
	for i := range found {
		steps[i] = found[i].Step
	}
	replay.Timeline(steps)
	return steps, nil
}
