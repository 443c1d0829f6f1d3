package console

import (
	"bytes"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// Guards the What-if page's refusals and its run: no session, no page; no
// CSRF token, no run; only an operator runs a what-if; a range not offered,
// an empty, oversized or invalid candidate policy are clear 400s naming the
// problem (an invalid key by its path); a valid one replays the range (here
// an empty ingress: nothing replayed, nothing changed) and shows the
// self-check and the limits.
func TestWhatifPage(t *testing.T) {
	h := pwHash()
	users := &Users{Users: []User{
		{Name: "olga", PasswordBcrypt: string(h), Roles: []string{RoleOperator}},
		{Name: "victor", PasswordBcrypt: string(h), Roles: []string{RoleViewer}},
	}}
	if err := users.Validate(); err != nil {
		t.Fatal(err)
	}
	base, _, _ := testConsole(t, Config{Users: users})

	anon := newClient(t, base)
	if code, _ := anon.do(http.MethodGet, "/whatif", nil); code != http.StatusSeeOther {
		t.Errorf("GET /whatif without a session: %d, want 303 to the sign-in", code)
	}
	if code, _ := anon.do(http.MethodPost, "/whatif", url.Values{"policy": {"retry_budget: 2\n"}}); code != http.StatusUnauthorized {
		t.Errorf("POST /whatif without a session: %d, want 401", code)
	}
	v := newClient(t, base)
	v.login("victor")
	if code, body := v.do(http.MethodPost, "/whatif", url.Values{"csrf": {v.token("/whatif")}, "policy": {"retry_budget: 2\n"}}); code != http.StatusForbidden || !strings.Contains(body, "needs the operator role") {
		t.Errorf("a viewer's what-if: %d, want 403 naming the operator role", code)
	}
	o := newClient(t, base)
	o.login("olga")
	post := func(form url.Values) (int, string) {
		form.Set("csrf", o.token("/whatif"))
		return o.do(http.MethodPost, "/whatif", form)
	}
	if code, _ := o.do(http.MethodPost, "/whatif", url.Values{"policy": {"retry_budget: 2\n"}}); code != http.StatusForbidden {
		t.Errorf("a what-if without a CSRF token: %d, want 403", code)
	}
	for _, c := range []struct {
		form url.Values
		want string
	}{
		{url.Values{"policy": {""}}, "Paste or upload the candidate policy"},
		{url.Values{"policy": {strings.Repeat("#", maxCandidateBytes+1)}}, "at most 262144"},
		{url.Values{"policy": {"network_timeout:\n  max_retries: -1\n"}}, "network_timeout.max_retries"},
		{url.Values{"policy": {"network_timeout:\n  max_retrys: 4\n"}}, "max_retrys"},
		{url.Values{"policy": {"retry_budget: 2\n"}, "hours": {"5"}}, "allowed [1 6 24 168] hours"},
	} {
		if code, body := post(c.form); code != http.StatusBadRequest || !strings.Contains(body, c.want) {
			t.Errorf("what-if %v: %d, want 400 naming %q:\n%s", c.form.Get("hours")+" "+c.form.Get("policy")[:min(40, len(c.form.Get("policy")))], code, c.want, pageError(body))
		}
	}
	code, body := post(url.Values{"policy": {"network_timeout:\n  max_retries: 4\n"}, "hours": {"1"}})
	if code != http.StatusOK {
		t.Fatalf("an operator's what-if: %d\n%s", code, pageError(body))
	}
	for _, want := range []string{`id="whatif-disagreements">0<`, `id="whatif-changed">0<`, `id="whatif-limits"`, "max_retries: 4"} {
		if !strings.Contains(body, want) {
			t.Errorf("the what-if page lacks %q", want)
		}
	}

	// the candidate uploaded as a file (the form is multipart): the file
	// wins over the text box, an oversized or invalid file is refused like
	// a pasted one, and a multipart form without the CSRF token is refused
	upload := func(csrf bool, text, file string) (int, string) {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		if csrf {
			mw.WriteField("csrf", o.token("/whatif"))
		}
		mw.WriteField("policy", text)
		mw.WriteField("hours", "1")
		fw, err := mw.CreateFormFile("policy_file", "candidate.yaml")
		if err != nil {
			t.Fatal(err)
		}
		fw.Write([]byte(file))
		mw.Close()
		return o.doBody(http.MethodPost, "/whatif", mw.FormDataContentType(), &buf)
	}
	if code, _ := upload(false, "", "retry_budget: 2\n"); code != http.StatusForbidden {
		t.Errorf("an upload without a CSRF token: %d, want 403", code)
	}
	for _, c := range []struct{ file, want string }{
		{strings.Repeat("#", maxCandidateBytes+1), "at most 262144"},
		{"auth_failed:\n  max_retries: -2\n", "auth_failed.max_retries"},
	} {
		if code, body := upload(true, "retry_budget: 2\n", c.file); code != http.StatusBadRequest || !strings.Contains(body, c.want) {
			t.Errorf("an uploaded policy %.30q: %d, want 400 naming %q:\n%s", c.file, code, c.want, pageError(body))
		}
	}
	code, body = upload(true, "retry_budget: 2\n", "auth_failed:\n  max_retries: 3\n")
	if code != http.StatusOK || !strings.Contains(body, "auth_failed:\n  max_retries: 3") || !strings.Contains(body, `id="whatif-changed">0<`) {
		t.Errorf("an operator's uploaded what-if: %d, want the report of the uploaded file:\n%s", code, pageError(body))
	}
	if code, body = upload(true, "network_timeout:\n  max_retries: 5\n", ""); code != http.StatusOK || !strings.Contains(body, "max_retries: 5") {
		t.Errorf("a what-if with the file input left empty: %d, want the pasted text's report:\n%s", code, pageError(body))
	}
}
