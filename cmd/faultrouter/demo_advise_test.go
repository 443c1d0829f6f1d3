package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

// Guards the demo's last word: it ends with one proposal of the policy
// advisor, mined from its own stream (provider acme's second retries never
// succeed), with its evidence, the override it adds and its what-if.
func TestDemoEndsWithAProposal(t *testing.T) {
	var out bytes.Buffer
	if err := dispatch(context.Background(), []string{"demo"}, strings.NewReader(""), &out, io.Discard); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	s := out.String()
	i := strings.Index(s, "Policy advisor")
	if i < 0 || strings.Index(s, "Cost of the stream") > i {
		t.Fatalf("the demo does not end with the advisor, after the cost table:\n%s", s)
	}
	adv := s[i:]
	for _, want := range []string{
		"proposal:  network_timeout.max_retries 2 -> 1 for provider=acme",
		"succeeded 0 of 30 times",
		"match: {provider: acme,",
		"network_timeout: {max_retries: 1}",
		"30 attempts fewer",
		"0 disagreements",
	} {
		if !strings.Contains(adv, want) {
			t.Errorf("the advisor's ending lacks %q:\n%s", want, adv)
		}
	}
}
