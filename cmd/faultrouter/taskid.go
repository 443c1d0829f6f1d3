package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/faultrouter/faultrouter/pkg/taskid"
)

// taskidUsage is the synopsis of the taskid verb.
const taskidUsage = "usage: faultrouter taskid --file F --user U --action A [--authorization ID]"

// taskidCommand runs `taskid`: it prints the deterministic task ID (package
// taskid) of the file's content for the user and action, one line on stdout.
// --file - reads the content from stdin.
func taskidCommand(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("taskid", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	file := fs.String("file", "", "the task's input content; - reads stdin")
	user := fs.String("user", "", "the submitting user's ID")
	action := fs.String("action", "", "the business action, e.g. refund or contract_review")
	authorization := fs.String("authorization", "", "the approval's ID; separates two separately approved identical operations")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stdout, taskidUsage)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return nil
	} else if err != nil {
		return fmt.Errorf("taskid: %w; %s", err, taskidUsage)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("taskid: unexpected argument %q; %s", fs.Arg(0), taskidUsage)
	}
	var missing []string
	for _, f := range []struct{ name, value string }{{"--file", *file}, {"--user", *user}, {"--action", *action}} {
		if f.value == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("taskid: missing %s; %s", strings.Join(missing, ", "), taskidUsage)
	}

	var in io.Reader = os.Stdin
	if *file != "-" {
		f, err := os.Open(*file)
		if err != nil {
			return fmt.Errorf("taskid: %w", err)
		}
		defer f.Close()
		in = f
	}
	id, err := taskid.FromReader(in, *user, *action, *authorization)
	if err != nil {
		return fmt.Errorf("taskid: reading %s: %w", *file, err)
	}
	_, err = fmt.Fprintln(stdout, id)
	return err
}
