package integration

import (
	"strings"
	"testing"
)

// TestCLIMissingTopicNamesIt guards the CLI's answer to a topic prefix
// without topics: produce and the reading verbs (tail, replay) fail with one
// message that names the missing topic and the command that creates it, not
// Kafka's UNKNOWN_TOPIC_OR_PARTITION; once that command ran, produce works.
func TestCLIMissingTopicNamesIt(t *testing.T) {
	e := newEnv(t)
	event := `{"event_id":"e-1","task_id":"t-1","attempt":1,"occurred_at":"2026-11-29T10:00:00Z","source":"s","action":"a","provider":"p","model":"m","stage":"NETWORK","status":"ERROR","error":{"type":"TimeoutError"}}` + "\n"
	create := "`faultrouter topics apply --topic-prefix " + e.prefix + "` creates"
	for _, c := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{event, []string{"produce"}, "produce: topic " + e.prefix + "ai.tasks.ingress does not exist; " + create + " it"},
		{"", []string{"tail", "--topic", "audit", "--until-end"}, "tail: topic " + e.prefix + "ai.tasks.audit does not exist; " + create + " it"},
		{"", []string{"replay", "--task", "t-1", "--timeline"}, "replay: topics " + e.prefix + "ai.tasks.alerts, "},
	} {
		out, errOut, err := e.tryCLI(c.stdin, c.args...)
		if err == nil {
			t.Fatalf("faultrouter %s succeeded without topics: %s", strings.Join(c.args, " "), out)
		}
		if !strings.Contains(errOut, c.want) || strings.Contains(errOut, "UNKNOWN_TOPIC_OR_PARTITION") {
			t.Errorf("faultrouter %s: stderr %q, want it to contain %q and no Kafka error code", strings.Join(c.args, " "), errOut, c.want)
		}
		if c.args[0] == "replay" && !strings.Contains(errOut, "do not exist; "+create+" them") {
			t.Errorf("faultrouter replay: stderr %q, want the command that creates the topics", errOut)
		}
	}

	e.cli("", "topics", "apply", "--topic-prefix", e.prefix)
	if out := e.cli(event, "produce"); !strings.Contains(out, "produced 1 records to "+e.prefix+"ai.tasks.ingress") {
		t.Errorf("produce after topics apply: %q", out)
	}
}
