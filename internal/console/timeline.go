package console

// timeline.go: one task's story, the same as `faultrouter replay --task ID
// --timeline`: every record of the task on ingress, decisions, audit,
// retry, review, dead letter and alerts, in time order, each step with its
// decision and reason. The reviewer of a decision shows on its step, and
// the operator actions on the task above the steps.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/faultrouter/faultrouter/internal/replay"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// Bounds of a timeline: it reads from timelineSince ago unless the page
// asks for more (since=..., at most timelineMaxSince ago: an older start
// would hold a read slot for as long as the topics' whole history takes;
// faultrouter replay --task reads further), only the task's partition of
// each topic, and at
// most timelineReads timelines are read at once (a page beyond waits up to
// timelineWait, then is refused with 503 and Retry-After).
const (
	timelineSince    = 7 * 24 * time.Hour
	timelineMaxSince = 90 * 24 * time.Hour
	timelineReads    = 2
	timelineWait     = 5 * time.Second
	maxTaskID        = 1024
)

func (s *Server) timelinePage(w http.ResponseWriter, r *http.Request, p *person) error {
	q := r.URL.Query()
	id := strings.TrimSpace(q.Get("id"))
	sinceArg := strings.TrimSpace(q.Get("since"))
	since := time.Now().Add(-timelineSince)
	if sinceArg != "" {
		t, err := replay.ParseTime(sinceArg, time.Now())
		if err != nil {
			return badRequest(fmt.Sprintf("Since %q: give an RFC 3339 time (2026-11-29T02:00:00Z) or a relative one (-720h).", sinceArg))
		}
		if time.Since(t) > timelineMaxSince {
			return badRequest(fmt.Sprintf("Since %q: at most %s back (-%s); for older records use faultrouter replay --task %s --since ...",
				sinceArg, "90 days", timelineMaxSince, id))
		}
		since = t
	}
	data := map[string]any{"ID": id, "Since": sinceArg, "DefaultSince": "-" + timelineSince.String()}
	if len(id) > maxTaskID {
		return badRequest(fmt.Sprintf("A task ID of %d bytes: at most %d.", len(id), maxTaskID))
	}
	if id != "" {
		select {
		case s.timelines <- struct{}{}:
			defer func() { <-s.timelines }()
		case <-time.After(timelineWait):
			w.Header().Set("Retry-After", "5")
			return &userError{Status: http.StatusServiceUnavailable, Msg: fmt.Sprintf("%d timelines are being read already: try again in a few seconds.", timelineReads)}
		case <-r.Context().Done():
			return nil
		}
		steps, err := s.timeline(r.Context(), id, since)
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

// timeline reads the task's records since a time from its partition of
// every topic of its story.
func (s *Server) timeline(ctx context.Context, id string, since time.Time) ([]replay.Step, error) {
	shortOf := map[string]topicspec.Short{}
	var topics []string
	for _, short := range replay.TimelineShorts {
		n := s.topic(short)
		shortOf[n] = short
		topics = append(topics, n)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	found, err := replay.Read(ctx, s.cfg.Kafka, s.codec, topics, replay.ReadOptions{Filter: replay.Filter{Task: id, Since: since}, ShortOf: shortOf,
		Key: []byte(id), Idle: 10 * time.Second})
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
