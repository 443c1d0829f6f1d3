package console

// sessions.go: a session is a signed cookie (name, session ID, sign-in
// time, last use, a fingerprint of the password hash) checked on every
// request against what the server knows:
//
//   - it ends 12 hours after sign-in, and after SessionIdle without use (the
//     cookie's last use is renewed as it is used);
//   - it ends when the person's entry leaves the users file or its password
//     hash changes (the file is read again when it changes, and on SIGHUP);
//   - it ends when its owner signs out: the sign-out is a record on the
//     console topic, which every replica reads, so a copy of the cookie
//     stops working on every replica, not only where the person signed out;
//     signing out everywhere ends every session the person signed in
//     before (the replicas' clocks are assumed in step).
//
// Replicas behind one address share FAULTROUTER_CONSOLE_SECRET and the
// console topic.

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// session is what the cookie says.
type session struct {
	Name   string
	ID     string
	Issued time.Time
	Seen   time.Time
	PwFP   string
}

// pwFingerprint ties a session to the password hash it signed in with.
func pwFingerprint(u *User) string {
	h := sha256.Sum256([]byte(u.PasswordBcrypt))
	return hex.EncodeToString(h[:8])
}

func (s *Server) encodeSession(ss session) string {
	parts := []string{base64.RawURLEncoding.EncodeToString([]byte(ss.Name)), ss.ID, strconv.FormatInt(ss.Issued.UnixMilli(), 10),
		strconv.FormatInt(ss.Seen.UnixMilli(), 10), ss.PwFP}
	raw := strings.Join(parts, "|")
	return base64.RawURLEncoding.EncodeToString([]byte(raw + "|" + hex.EncodeToString(s.mac("session", raw))))
}

func (s *Server) decodeSession(v string) (session, error) {
	b, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil {
		return session{}, errNoSession
	}
	i := bytes.LastIndexByte(b, '|')
	if i < 0 || !hmac.Equal([]byte(hex.EncodeToString(s.mac("session", string(b[:i])))), b[i+1:]) {
		return session{}, errNoSession
	}
	parts := strings.Split(string(b[:i]), "|")
	if len(parts) != 5 {
		return session{}, errNoSession
	}
	name, err1 := base64.RawURLEncoding.DecodeString(parts[0])
	issued, err2 := strconv.ParseInt(parts[2], 10, 64)
	seen, err3 := strconv.ParseInt(parts[3], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return session{}, errNoSession
	}
	return session{Name: string(name), ID: parts[1], Issued: time.UnixMilli(issued), Seen: time.UnixMilli(seen), PwFP: parts[4]}, nil
}

// sessionPerson checks the session cookie of r and returns its person,
// renewing the cookie's last use on w; nil when there is no valid session.
func (s *Server) sessionPerson(w http.ResponseWriter, r *http.Request) *person {
	return s.checkSession(w, r, true)
}

// checkSession is sessionPerson; without idle, a session idle for longer
// than SessionIdle still counts (an open live-update stream is checked
// for the other ends of its session, not for use).
func (s *Server) checkSession(w http.ResponseWriter, r *http.Request, idle bool) *person {
	c, err := r.Cookie(s.cookieName(sessionCookie))
	if err != nil {
		return nil
	}
	ss, err := s.decodeSession(c.Value)
	if err != nil {
		return nil
	}
	now := time.Now()
	switch {
	case now.Sub(ss.Issued) > sessionTTL, idle && now.Sub(ss.Seen) > s.cfg.SessionIdle:
		return nil
	case s.revoked(ss):
		return nil
	}
	u := s.users().find(ss.Name)
	if u == nil || u.Name != ss.Name || u.PasswordBcrypt == "" || pwFingerprint(u) != ss.PwFP {
		return nil // removed from the users file, or its password changed
	}
	if now.Sub(ss.Seen) >= s.sessionRenew() && w != nil {
		ss.Seen = now
		s.writeSession(w, r, ss)
	}
	return &person{Name: u.Name, Roles: u.Roles, Owners: u.Owners, Session: ss.ID}
}

// sessionRenew is how old the cookie's last use may get before a request
// renews it.
func (s *Server) sessionRenew() time.Duration { return min(time.Minute, s.cfg.SessionIdle/4) }

// setSession starts a session of u.
func (s *Server) setSession(w http.ResponseWriter, r *http.Request, u *User) {
	now := time.Now()
	s.writeSession(w, r, session{Name: u.Name, ID: newID(), Issued: now, Seen: now, PwFP: pwFingerprint(u)})
}

func (s *Server) writeSession(w http.ResponseWriter, r *http.Request, ss session) {
	left := sessionTTL - time.Since(ss.Issued)
	http.SetCookie(w, &http.Cookie{Name: s.cookieName(sessionCookie), Value: s.encodeSession(ss), Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: s.secure(r), MaxAge: int(left / time.Second)})
}

// revoked reports whether the session was signed out, itself or with
// every session of its person.
func (s *Server) revoked(ss session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.signedOut[ss.ID]; ok {
		return true
	}
	before, ok := s.allOutBefore[ss.Name]
	return ok && !ss.Issued.After(before)
}

// revokeAll ends every session of name signed in up to at.
func (s *Server) revokeAll(name string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if at.After(s.allOutBefore[name]) {
		s.allOutBefore[name] = at
	}
	for k, t := range s.allOutBefore {
		if time.Since(t) > sessionTTL+time.Hour {
			delete(s.allOutBefore, k)
		}
	}
}

// revoke ends a session on this replica; expired ones are forgotten.
func (s *Server) revoke(id string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.signedOut[id] = at
	for k, t := range s.signedOut {
		if time.Since(t) > sessionTTL+time.Hour {
			delete(s.signedOut, k)
		}
	}
}

// logout ends p's session (with all, every session of p) here and,
// through the console topic, on every replica.
func (s *Server) logout(ctx context.Context, p *person, all bool) error {
	now := time.Now()
	a := opAction{Action: "logout", User: p.Name, Session: p.Session, At: now}
	s.revoke(p.Session, now)
	if all {
		s.revokeAll(p.Name, now)
		a.Action, a.What = "logout_all", "signed out every session"
	}
	if err := s.produce(ctx, s.actionRecord(&a)); err != nil {
		s.log.Error("console: sign-out not written to the console topic", "user", p.Name, "err", err)
		return &userError{Status: http.StatusServiceUnavailable, Msg: "Signed out on this replica, but the sign-out could not be written to Kafka: " +
			"other replicas accept a copy of this session until it expires. Sign in and out again when Kafka is back."}
	}
	s.log.Info("console: signed out", "user", p.Name)
	return nil
}

// produce writes one record synchronously with the console's producer.
func (s *Server) produce(ctx context.Context, rec *kgo.Record) error {
	if s.producer == nil {
		return errors.New("console: not running")
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return s.producer.ProduceSync(ctx, rec).FirstErr()
}

// consoleTopic is the console's own topic: sign-outs (and operator
// actions), beside the router's topics and with their prefix.
func (s *Server) consoleTopic() string {
	if s.cfg.ConsoleTopic != "" {
		return s.cfg.ConsoleTopic
	}
	return s.cfg.Topics.Prefix() + ConsoleTopicName
}

// ConsoleTopicName is the console's own topic without the topics' prefix.
const ConsoleTopicName = "faultrouter.console"

// consoleShort is the console's own topic among the short names of the
// topics it reads (it is not one of the router's).
const consoleShort topicspec.Short = "console"

// consoleTopicRetention keeps the sign-outs and the operator actions.
const consoleTopicRetention = 90 * 24 * time.Hour

// ensureConsoleTopic creates the console topic when it is missing.
func (s *Server) ensureConsoleTopic(ctx context.Context, adm *kadm.Client) error {
	ret := strconv.FormatInt(consoleTopicRetention.Milliseconds(), 10)
	resp, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"retention.ms": &ret, "cleanup.policy": ptr("delete")}, s.consoleTopic())
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("console: the console topic %s is missing and could not be created (create it, one partition is enough, or allow the console to): %w", s.consoleTopic(), err)
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

// readConsoleTopic reads the sign-outs of the last session lifetime, closes
// ready once it has read up to the end it found at start, and goes on
// reading until ctx ends.
func (s *Server) readConsoleTopic(ctx context.Context, ready chan<- struct{}) error {
	adm, err := kgo.NewClient(s.cfg.Kafka...)
	if err != nil {
		return err
	}
	var starts, ends kadm.ListedOffsets
	for {
		ka := kadm.NewClient(adm)
		err = s.ensureConsoleTopic(ctx, ka)
		if err == nil {
			starts, err = ka.ListOffsetsAfterMilli(ctx, time.Now().Add(-sessionTTL-time.Hour).UnixMilli(), s.consoleTopic())
		}
		if err == nil {
			ends, err = ka.ListEndOffsets(ctx, s.consoleTopic())
		}
		if err == nil {
			err = errors.Join(starts.Error(), ends.Error())
		}
		if err == nil || ctx.Err() != nil {
			break
		}
		s.log.Warn("console: reading the console topic", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
	adm.Close()
	if ctx.Err() != nil {
		return nil
	}
	parts := 0
	ends.Each(func(kadm.ListedOffset) { parts++ })
	s.consoleParts.Store(int32(parts))
	consume := map[string]map[int32]kgo.Offset{s.consoleTopic(): {}}
	todo := map[int32]int64{}
	starts.Each(func(o kadm.ListedOffset) {
		consume[o.Topic][o.Partition] = kgo.NewOffset().At(o.Offset)
		if e, ok := ends.Lookup(o.Topic, o.Partition); ok && e.Offset > o.Offset {
			todo[o.Partition] = e.Offset
		}
	})
	// control records too: a transaction's marker at a partition's end
	// tells that the end was read
	cl, err := kgo.NewClient(append(s.cfg.Kafka, kgo.ConsumePartitions(consume), kgo.KeepControlRecords())...)
	if err != nil {
		return err
	}
	defer cl.Close()
	if len(todo) == 0 {
		close(ready)
		ready = nil
	}
	for {
		pctx, pcancel := ctx, context.CancelFunc(func() {})
		if ready != nil {
			// the end offsets are read (control records included); a fetch
			// that stays empty this long (a broker that answers nothing)
			// counts as read rather than keep the console from serving
			pctx, pcancel = context.WithTimeout(ctx, 30*time.Second)
		}
		fs := cl.PollFetches(pctx)
		quiet := fs.NumRecords() == 0 && pctx.Err() != nil && ctx.Err() == nil
		pcancel()
		if ctx.Err() != nil {
			return nil
		}
		if quiet && ready != nil {
			s.log.Warn("console: the console topic went quiet before its end offsets; serving", "topic", s.consoleTopic())
			close(ready)
			ready = nil
			continue
		}
		fs.EachError(func(t string, p int32, err error) {
			s.log.Warn("console: fetch", "topic", t, "partition", p, "err", err)
		})
		var partsErr error
		fs.EachRecord(func(rec *kgo.Record) {
			if rec.Attrs.IsControl() {
				if end, ok := todo[rec.Partition]; ok && rec.Offset+1 >= end {
					delete(todo, rec.Partition)
				}
				return
			}
			var a opAction
			if json.Unmarshal(rec.Value, &a) == nil && a.Parts != 0 && a.Parts != parts && partsErr == nil {
				partsErr = fmt.Errorf("console: the console topic %s has %d partitions, but a record of %s was written when it had %d: "+
					"a task's claims (and a confirmation's uses) may sit on two partitions, where replicas read them in different orders. "+
					"Keep the console topic's partition count fixed; to start over, name a new topic with --console-topic (sign-outs and claims start empty there)",
					s.consoleTopic(), parts, a.At.UTC().Format(time.RFC3339), a.Parts)
			}
			if json.Unmarshal(rec.Value, &a) == nil {
				if (a.Action == "logout" || a.Action == "logout_all") && a.Session != "" {
					s.revoke(a.Session, a.At)
				}
				if a.Action == "logout_all" && a.User != "" {
					s.revokeAll(a.User, a.At)
				}
				if a.Set != "" {
					s.markSetUsed(a.Set, a.At, a.Use)
				}
				if a.Kind == "action" && (a.Action == actClaim || a.Action == actAssign || a.Action == actRelease || a.Action == actLease) {
					s.applyClaim(&a)
				}
			}
			s.consoleRead(rec.Partition, rec.Offset)
			if end, ok := todo[rec.Partition]; ok && rec.Offset+1 >= end {
				delete(todo, rec.Partition)
			}
		})
		if partsErr != nil {
			if ready != nil {
				return partsErr // before serving: one clear error
			}
			s.log.Error("console: the console topic's partition count changed while running; restart every replica", "err", partsErr)
		}
		if ready != nil && len(todo) == 0 {
			close(ready)
			ready = nil
		}
	}
}

// partitions is the console topic's partition count as read at start; 0
// before.
func (s *Server) partitions() int { return int(s.consoleParts.Load()) }

// users is the users file as last read.
func (s *Server) users() *Users { return s.usersNow.Load() }

// ReloadUsers reads the users file again; on an error the users stay as
// they were.
func (s *Server) ReloadUsers() error {
	if s.cfg.UsersFile == "" {
		return nil
	}
	b, err := os.ReadFile(s.cfg.UsersFile)
	if err != nil {
		return fmt.Errorf("console: users file: %w", err)
	}
	sum := sha256.Sum256(b)
	s.mu.Lock()
	same := sum == s.usersSum
	s.mu.Unlock()
	if same {
		return nil
	}
	u, err := parseUsers(s.cfg.UsersFile, b)
	if err != nil {
		s.log.Error("console: users file not reloaded; the previous one stays", "path", s.cfg.UsersFile, "err", err)
		return err
	}
	s.mu.Lock()
	s.usersSum = sum
	s.mu.Unlock()
	s.usersNow.Store(u)
	s.log.Info("console: users file reloaded", "path", s.cfg.UsersFile, "users", len(u.Users))
	return nil
}

// watchUsers reads the users file again whenever it changes.
func (s *Server) watchUsers(ctx context.Context) {
	if s.cfg.UsersFile == "" {
		return
	}
	t := time.NewTicker(s.cfg.UsersCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.ReloadUsers()
		}
	}
}
