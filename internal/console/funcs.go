package console

import (
	"encoding/base64"
	"fmt"
	"html/template"
	"net/url"
	"strings"
	"time"
)

// funcs are the template helpers.
var funcs = template.FuncMap{
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"left": func(due, now time.Time) string { return roundDur(due.Sub(now)) },
	// weblink: a URI the browser can open (an input snapshot may be s3://...)
	"weblink": func(u string) bool { return strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "http://") },
	"money":   func(f float64) string { return fmt.Sprintf("$%.4f", f) },
	"join":    strings.Join,
	"b64":     func(b []byte) string { return base64.StdEncoding.EncodeToString(b) },
	"str":     func(b []byte) string { return string(b) },
	"lines":   func(s string) []string { return strings.Split(s, "\n") },
	"add":     func(a, b int) int { return a + b },
	"ms":      func(n int64) string { return (time.Duration(n) * time.Millisecond).String() },
	"mul":     func(a, b int) int { return a * b },
	"query": func(kv ...string) template.URL {
		v := url.Values{}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] != "" {
				v.Set(kv[i], kv[i+1])
			}
		}
		return template.URL(v.Encode())
	},
}

// roundDur prints a duration to the second, negative when past.
func roundDur(d time.Duration) string {
	neg := d < 0
	if neg {
		d = -d
	}
	out := d.Round(time.Second).String()
	if d >= time.Hour {
		out = d.Round(time.Minute).String()
	}
	if neg {
		return "-" + out
	}
	return out
}

// flash is the banner of the outcome a POST redirected with: its words,
// and what the page's script reads of it (the task a decision or a claim
// named, to select the next item).
type flash struct {
	Text, Done, Task string
}

// flashOf words the outcome a POST redirected with (done=..., task=...,
// from the signed flash cookie): the text comes from here, never from the
// URL. Nil without one.
func flashOf(q url.Values) *flash {
	done, task := q.Get("done"), q.Get("task")
	if text := flashText(q); text != "" {
		return &flash{Text: text, Done: done, Task: task}
	}
	return nil
}

func flashText(q url.Values) string {
	task, n := q.Get("task"), q.Get("n")
	switch q.Get("done") {
	case "approve":
		return fmt.Sprintf("Approval of %s sent. The item closes when the router audits it.", task)
	case "reject":
		return fmt.Sprintf("Rejection of %s sent. The item closes when the router audits it.", task)
	case "bulk":
		msg := fmt.Sprintf("%s decisions sent. The items close as the router audits them.", n)
		if k := q.Get("skipped"); k != "" && k != "0" {
			msg += fmt.Sprintf(" %s previewed items were skipped: decided or closed since the preview.", k)
		}
		return msg
	case "reset":
		return fmt.Sprintf("Reset of %s sent to %s partitions of the decisions topic.", task, n)
	case "job":
		return fmt.Sprintf("Re-drive job %s started.", task)
	case "claim":
		return fmt.Sprintf("You hold %s now; others see it claimed until the claim ends.", task)
	case "release":
		return fmt.Sprintf("Claim on %s released.", task)
	case "assign":
		return fmt.Sprintf("%s assigned.", task)
	}
	return ""
}
