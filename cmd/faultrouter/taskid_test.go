package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Guards the CLI contract of `taskid`: a file and stdin give the same ID,
// --authorization changes it, and a missing flag is named.
func TestTaskidCommand(t *testing.T) {
	path := filepath.Join(t.TempDir(), "contract.txt")
	if err := os.WriteFile(path, []byte("contract v3, page 1-12"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := taskidCommand([]string{"--file", path, "--user", "alice@example.com", "--action", "contract_review"}, &out); err != nil {
		t.Fatal(err)
	}
	if out.String() != "t1-gbfytwymocayisfkuruu2svjbz\n" {
		t.Errorf("out = %q", out.String())
	}
	r, w, _ := os.Pipe()
	w.WriteString("contract v3, page 1-12")
	w.Close()
	old := os.Stdin
	os.Stdin = r
	out.Reset()
	err := taskidCommand([]string{"--file", "-", "--user", "alice@example.com", "--action", "contract_review"}, &out)
	os.Stdin = old
	if err != nil || out.String() != "t1-gbfytwymocayisfkuruu2svjbz\n" {
		t.Errorf("stdin: %q, %v", out.String(), err)
	}
	out.Reset()
	if err := taskidCommand([]string{"--file", path, "--user", "alice@example.com", "--action", "contract_review", "--authorization", "a-1"}, &out); err != nil || out.String() == "t1-gbfytwymocayisfkuruu2svjbz\n" {
		t.Errorf("authorization: %q, %v", out.String(), err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--file", path}, "missing --user, --action"},
		{[]string{"--user", "u", "--action", "a"}, "missing --file"},
		{[]string{"--file", path + ".nope", "--user", "u", "--action", "a"}, "no such file"},
		{[]string{"--file", path, "--user", "u", "--action", "a", "x"}, `unexpected argument "x"`},
		{[]string{"--bogus"}, "flag provided but not defined: -bogus"},
	} {
		err := taskidCommand(tc.args, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
		t.Log(err)
	}
}
