package main

import (
	"context"
	"io"
	"strings"
	"testing"
)

// Guards the CLI contract "a bad flag is one clear message naming the field
// and what is allowed": run and tail reject bad flags before touching Kafka.
func TestBadFlagsNameTheFlag(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"run without state dir", []string{"run"}, "--state-dir is required"},
		{"run with a zero record limit", []string{"run", "--state-dir", t.TempDir(), "--max-record-bytes", "0"}, "--max-record-bytes must be a positive"},
		{"run with an empty instance", []string{"run", "--state-dir", t.TempDir(), "--instance-id", ""}, "--instance-id must not be empty"},
		{"run with a short session timeout", []string{"run", "--state-dir", t.TempDir(), "--session-timeout", "500ms"}, "--session-timeout must be at least 1s"},
		{"run with an unknown compression", []string{"run", "--state-dir", t.TempDir(), "--compression", "brotli"}, `--compression must be one of none, snappy, lz4, zstd, gzip, got "brotli"`},
		{"run with an unknown group protocol", []string{"run", "--state-dir", t.TempDir(), "--group-protocol", "sticky"}, `--group-protocol (env FAULTROUTER_GROUP_PROTOCOL) must be one of eager, cooperative, got "sticky"`},
		{"run with a negative heap budget", []string{"run", "--state-dir", t.TempDir(), "--heap-budget-mib", "-1"}, "--heap-budget-mib must be 0 (Go's default pacing) or a positive number of MiB, got -1"},
		{"run with a bad log format", []string{"run", "--state-dir", t.TempDir(), "--log-format", "xml"}, "allowed text, json"},
		{"run with a bad SASL mechanism", []string{"run", "--state-dir", t.TempDir(), "--sasl-mechanism", "GSSAPI"}, "allowed PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"},
		{"tail with a bad format", []string{"tail", "--topic", "audit", "--format", "yaml"}, "allowed json, text"},
		{"produce to a bad topic", []string{"produce", "--topic", "audit"}, "allowed ingress, decisions"},
		{"unknown verb", []string{"frobnicate"}, `unknown verb "frobnicate"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := dispatch(context.Background(), c.args, strings.NewReader(""), io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("faultrouter %s: error %v, want one naming %q", strings.Join(c.args, " "), err, c.want)
			}
		})
	}
}

// Guards the environment of run's group flags: a value that is not a
// duration, or not true or false, is one error naming the variable.
func TestBadGroupEnvNamesTheVariable(t *testing.T) {
	for _, c := range []struct{ key, value, want string }{
		{"FAULTROUTER_SESSION_TIMEOUT", "ten", "FAULTROUTER_SESSION_TIMEOUT=\"ten\" is not a duration"},
		{"FAULTROUTER_STATIC_MEMBERSHIP", "yes", "FAULTROUTER_STATIC_MEMBERSHIP=\"yes\" must be true or false"},
	} {
		t.Run(c.key, func(t *testing.T) {
			t.Setenv(c.key, c.value)
			err := dispatch(context.Background(), []string{"run", "--state-dir", t.TempDir()}, strings.NewReader(""), io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s=%s: error %v, want %q", c.key, c.value, err, c.want)
			}
		})
	}
}
