package console

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// Guards the operator log: every operator action (sign-in, a decision, a
// breaker reset, sign-out) is a record on the console topic naming who,
// when, what and why; the operator log page lists them newest first, and a
// task's timeline shows the actions on that task.
func TestOperatorActionsAreRecordsOnTheConsoleTopic(t *testing.T) {
	h := pwHash()
	users := &Users{Users: []User{
		{Name: "olga", PasswordBcrypt: string(h), Roles: []string{RoleReviewer, RoleOperator}, Owners: []string{"*"}},
	}}
	base, opts, set := testConsole(t, Config{Users: users})
	olga := newClient(t, base)
	olga.login("olga")
	waitQueue(t, olga, "t-1")
	tok := olga.token("/review")
	if code, body := olga.do(http.MethodPost, "/review/decide", url.Values{"csrf": {tok}, "task": {"t-1"}, "action": {"approve"}, "reason": {"looks right"}}); code != http.StatusSeeOther {
		t.Fatalf("approve: %d %s", code, pageError(body))
	}
	if code, body := olga.do(http.MethodPost, "/breakers/reset", url.Values{"csrf": {tok}, "scope": {"PROMPT_TEMPLATE"}, "key": {"ship-v2"}, "reason": {"template fixed"}}); code != http.StatusSeeOther {
		t.Fatalf("reset: %d %s", code, pageError(body))
	}
	logout(t, olga)

	topic := (&Server{cfg: Config{Topics: set}}).consoleTopic()
	var got []opAction
	if !eventually(func() bool {
		got = nil
		for _, r := range readAll(t, opts, topic) {
			var a opAction
			if json.Unmarshal(r.Value, &a) == nil {
				got = append(got, a)
			}
		}
		return len(got) >= 4
	}) {
		t.Fatalf("console topic holds %d actions, want 4: %+v", len(got), got)
	}
	want := []struct{ action, why, task string }{{"login", "", ""}, {"approve", "looks right", "t-1"}, {"breaker_reset", "template fixed", ""}, {"logout", "", ""}}
	for i, w := range want {
		a := got[i]
		if a.Action != w.action || a.User != "olga" || a.At.IsZero() || a.Why != w.why || (w.task != "" && (len(a.Tasks) != 1 || a.Tasks[0] != w.task)) {
			t.Errorf("action %d: %+v, want %s by olga, why %q, task %q", i, a, w.action, w.why, w.task)
		}
	}

	olga = newClient(t, base)
	olga.login("olga")
	body := waitFor(t, olga, "/operators", func(b string) bool { return strings.Contains(b, "template fixed") && strings.Contains(b, "logout") })
	if i, j := strings.Index(body, "template fixed"), strings.Index(body, "looks right"); i < 0 || j < 0 || i > j {
		t.Errorf("the operator log is not newest first:\n%s", body)
	}
	if _, body := olga.do(http.MethodGet, "/task?id=t-1", nil); !strings.Contains(body, `id="operator-actions"`) || !strings.Contains(body, "looks right") {
		t.Errorf("t-1's timeline does not show olga's approval:\n%s", body)
	}
}
