package console

// fixedset.go: a bulk decision or a re-drive is confirmed on exactly what
// its preview showed. The preview gives the selection an ID and signs it
// (who, what, why, the items or a digest of the records, the rate) into
// the confirmation form; the confirmation acts on the signed items only,
// is refused when altered or older than setTTL, and is refused the second
// time. A confirmation is used through the console topic: a set-use record
// keyed by the selection, read back before anything is done; the request
// whose record is the selection's first in the topic acts, any other is
// refused, so a confirmation posted to two replicas at once acts once.

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// setTTL is how long a preview may be confirmed.
const setTTL = time.Hour

// newSet is the ID of a preview's selection: its time and a random part.
func newSet(now time.Time) string {
	b := make([]byte, 8)
	rand.Read(b)
	return strconv.FormatInt(now.UnixMilli(), 36) + "-" + hex.EncodeToString(b)
}

// setSig signs a selection for one person.
func (s *Server) setSig(kind, who, set string, fields ...string) string {
	return hex.EncodeToString(s.mac(append([]string{"set", kind, who, set}, fields...)...))
}

// checkSet verifies a confirmation's signature and age.
func (s *Server) checkSet(sig, kind, who, set string, fields ...string) error {
	i := strings.IndexByte(set, '-')
	ms, err := strconv.ParseInt(set[:max(i, 0)], 36, 64)
	if i < 0 || err != nil || sig == "" || !hmac.Equal([]byte(sig), []byte(s.setSig(kind, who, set, fields...))) {
		return badRequest("Refused: this confirmation does not match its preview (the form was altered). Preview again.")
	}
	if time.Since(time.UnixMilli(ms)) > setTTL {
		return badRequest(fmt.Sprintf("Refused: this preview is older than %s. Preview again.", setTTL))
	}
	return nil
}

// claimSet marks a selection used, refusing one used already.
func (s *Server) claimSet(set string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if at, ok := s.usedSets[set]; ok {
		return conflict(fmt.Sprintf("Refused: this confirmation was submitted already (at %s); nothing was done twice.", at.UTC().Format(time.RFC3339)))
	}
	now := time.Now()
	s.usedSets[set] = now
	for k, t := range s.usedSets {
		if now.Sub(t) > 2*setTTL {
			delete(s.usedSets, k)
			delete(s.firstUse, k)
		}
	}
	return nil
}

func (s *Server) releaseSet(set string) {
	s.mu.Lock()
	delete(s.usedSets, set)
	s.mu.Unlock()
}

// markSetUsed applies a record of the console topic that names a
// selection: it is used, and the first set-use record read names the
// request that acts on it.
func (s *Server) markSetUsed(set string, at time.Time, use string) {
	s.mu.Lock()
	if _, ok := s.usedSets[set]; !ok {
		s.usedSets[set] = at
	}
	if _, ok := s.firstUse[set]; !ok && use != "" {
		s.firstUse[set] = use
	}
	s.mu.Unlock()
}

// useSet uses a confirmed selection for this request, through the console
// topic: it refuses a selection this replica knows used, writes a set-use
// record keyed by the selection, waits until it has read it back, and
// refuses unless that record is the selection's first in the topic (the
// same selection confirmed on another replica at the same moment).
func (s *Server) useSet(ctx context.Context, set, user string) error {
	if err := s.claimSet(set); err != nil {
		return err
	}
	use := newID()
	b, _ := json.Marshal(opAction{Kind: "set_use", Action: "confirm", User: user, At: time.Now(), Set: set, Use: use, Parts: s.partitions()})
	if err := s.writeAndReadBack(ctx, &kgo.Record{Topic: s.consoleTopic(), Key: []byte("set/" + set), Value: b}, "confirmation"); err != nil {
		s.releaseSet(set)
		return err
	}
	s.mu.Lock()
	first := s.firstUse[set]
	s.mu.Unlock()
	if first != use {
		return conflict("Refused: this confirmation was submitted already, on another replica of the console; nothing was done twice.")
	}
	return nil
}

// digest is a short fingerprint of a list.
func digest(items []string) string {
	h := sha256.New()
	for _, it := range items {
		h.Write([]byte(it))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// opAction is an operator's action as a record on the console topic: who,
// when, what and why, and the tasks it touched. A sign-out names its
// session, a confirmed bulk decision or re-drive its selection.
type opAction struct {
	Kind    string    `json:"kind"` // "action"
	Action  string    `json:"action"`
	User    string    `json:"user"`
	At      time.Time `json:"at"`
	What    string    `json:"what,omitempty"`
	Why     string    `json:"why,omitempty"`
	Tasks   []string  `json:"tasks,omitempty"`
	Set     string    `json:"set,omitempty"`
	Session string    `json:"session,omitempty"`
	// Holder and Until: who holds a claimed or assigned review item, and
	// until when (claims.go).
	Holder string    `json:"holder,omitempty"`
	Until  time.Time `json:"until,omitzero"`
	// Notice and Item: a webhook delivery's kind and the opening of the
	// item it was about (notify.go).
	Notice string    `json:"notice,omitempty"`
	Item   time.Time `json:"item,omitzero"`
	// MoreTasks counts the tasks beyond maxActionTasks left out of Tasks.
	MoreTasks int `json:"more_tasks,omitempty"`
	// Addr is the client address of a sign-in, and Tried the name typed
	// in a failed one that is not in the users file; the operator log
	// shows them to operators only.
	Addr  string `json:"addr,omitempty"`
	Tried string `json:"tried,omitempty"`
	// Use names one request's use of a confirmation (Kind "set_use").
	Use string `json:"use,omitempty"`
	// Parts is the console topic's partition count its writer saw at start:
	// a record keyed by a task or a selection is ordered with the others of
	// its key only while the count stays the same.
	Parts int `json:"parts,omitempty"`
}

// maxActionTasks bounds the task IDs one action record lists.
const maxActionTasks = 1000

func (s *Server) actionRecord(a *opAction) *kgo.Record {
	a.Kind = "action"
	if a.At.IsZero() {
		a.At = time.Now()
	}
	if len(a.Tasks) > maxActionTasks {
		a.MoreTasks, a.Tasks = len(a.Tasks)-maxActionTasks, a.Tasks[:maxActionTasks]
	}
	a.Parts = s.partitions()
	b, _ := json.Marshal(a)
	// the records whose order decides something share a key, so that they
	// share a partition on a console topic of several: a claim, assignment,
	// release or notice lease with every other of its task or notice
	key := a.User
	switch a.Action {
	case actClaim, actAssign, actRelease, actLease:
		if len(a.Tasks) == 1 {
			key = "task/" + a.Tasks[0]
		}
	}
	return &kgo.Record{Topic: s.consoleTopic(), Key: []byte(key), Value: b}
}

// record writes an operator action to the console topic and waits for it:
// an action whose record cannot be written must not be taken (the caller
// refuses it with the error, which says so).
func (s *Server) record(ctx context.Context, a opAction) error {
	if err := s.produce(ctx, s.actionRecord(&a)); err != nil {
		s.log.Error("console: operator action not written to the console topic; refused", "action", a.Action, "user", a.User, "err", err)
		return &userError{Status: http.StatusServiceUnavailable, Msg: "Refused: the operator log record of this action could not be written to Kafka, so nothing was done. Try again in a moment."}
	}
	return nil
}

// note writes a record to the operator log without waiting: failed and
// throttled sign-ins and webhook deliveries, which are not someone's
// action to refuse. A failure is logged.
func (s *Server) note(a opAction) {
	if s.producer == nil {
		return
	}
	s.producer.Produce(context.Background(), s.actionRecord(&a), func(_ *kgo.Record, err error) {
		if err != nil {
			s.log.Error("console: operator log record not written to the console topic", "action", a.Action, "user", a.User, "err", err)
		}
	})
}
