package console

import (
	"net/http"
	"strings"
	"testing"
)

// Guards the timeline's read bound: a since further back than 90 days is
// refused with one message naming the bound and the command that reads
// further, instead of holding one of the two timeline read slots for as
// long as the topics' whole history takes.
func TestTimelineSinceIsBounded(t *testing.T) {
	base, _, _ := testConsole(t, Config{Users: testUsers(t)})
	alice := newClient(t, base)
	alice.login("alice")
	for _, since := range []string{"1970-01-01T00:00:00Z", "-2161h"} {
		code, body := alice.do(http.MethodGet, "/task?id=t-1&since="+since, nil)
		if msg := pageError(body); code != http.StatusBadRequest || !strings.Contains(msg, "at most 90 days") || !strings.Contains(msg, "faultrouter replay") {
			t.Errorf("since %s: %d %q, want 400 naming the 90-day bound and faultrouter replay", since, code, msg)
		}
	}
	if code, _ := alice.do(http.MethodGet, "/task?id=t-1&since=-2000h", nil); code != http.StatusOK {
		t.Errorf("since -2000h: %d, want the timeline", code)
	}
}
