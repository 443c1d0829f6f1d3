// Command faultrouter routes the failures of AI workers on Kafka: it reads
// every attempt outcome from the ingress topic, classifies the failure and
// decides the one right next step (retry when due, human review, audit,
// dead letter), exactly once.
//
// Run `faultrouter help` for the verbs and `faultrouter VERB --help` for the
// flags of one verb.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `faultrouter routes the failures of AI workers on Kafka.

Workers report every attempt outcome to the ingress topic, keyed by task ID.
faultrouter deduplicates, classifies the failure, and routes it: retry (only
when a retry can help, when it is due, within one shared budget), human review,
audit, dead letter, exactly once.

Usage:
  faultrouter VERB [flags]

Try it first:
  faultrouter demo                  embedded broker, the router and a scripted stream; prints a summary

Verbs:
  run       the router (creates missing topics from topics/)
  demo      a self-contained demonstration; needs no Kafka
  produce   JSON lines in, Avro on the wire (ingress or decisions)
  tail      decoded records of a topic as JSON lines or text
  replay    incident analysis: a time range or one task's timeline; re-drive to ingress
  review    review decide: approve or reject a task in review
  breaker   breaker reset | latch: close a circuit breaker by hand, or latch one open until a reset
  console   the operator console in the browser: review queue, timeline, breakers, dead letter, alerts
  taskid    deterministic task ID of a file, user and action
  policy    policy check FILE | policy explain [--policy FILE] < event.json | policy default
            | policy whatif --policy FILE [--baseline FILE] --since T: a candidate policy on past traffic
            | policy advise --since T [--out FILE]: proposals mined from the audit and the reviewers
  cost      spend by class, model and template, failed vs succeeded, and cost prevented
  topics    topics apply | topics check
  schemas   schemas register | schemas check --registry URL: the schemas of avro/ in a schema registry
  version   print the version

Global flags (every verb that talks to Kafka):
  --brokers        seed brokers (env FAULTROUTER_BROKERS, default localhost:9092)
  --topic-prefix   prefix of every topic name (env FAULTROUTER_TOPIC_PREFIX)
  --sasl-mechanism PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; --sasl-user, --sasl-password
                   (env FAULTROUTER_SASL_PASSWORD)
  --tls, --tls-ca FILE, --tls-cert FILE, --tls-key FILE
  --log-format text|json, --log-level debug|info|warn|error
Schema registry flags (run, produce, review, tail, replay, console, schemas):
  --registry-url URL (env FAULTROUTER_REGISTRY_URL), --registry-user, --registry-password
  --registry-tls-ca FILE, --registry-tls-cert FILE, --registry-tls-key FILE
  --wire-format single-object|confluent (run, produce, review; env FAULTROUTER_WIRE_FORMAT)

Short topic names: ingress, decisions, retry, review, audit, deadletter, alerts.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := dispatch(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "faultrouter:", err)
		var unreachable errUnreachable
		if errors.As(err, &unreachable) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// dispatch runs one verb.
func dispatch(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("missing verb")
	}
	verb, rest := args[0], args[1:]
	switch verb {
	case "run":
		return runCommand(ctx, rest, stdout, stderr)
	case "demo":
		return demoCommand(ctx, rest, stdout, stderr)
	case "produce":
		return produceCommand(ctx, rest, stdin, stdout, stderr)
	case "replay":
		return replayCommand(ctx, rest, stdout, stderr)
	case "tail":
		return tailCommand(ctx, rest, stdout, stderr)
	case "review":
		return reviewCommand(ctx, rest, stdout, stderr)
	case "breaker":
		return breakerCommand(ctx, rest, stdout, stderr)
	case "console":
		return consoleCommand(ctx, rest, stdin, stdout, stderr)
	case "taskid":
		return taskidCommand(rest, stdout)
	case "policy":
		if len(rest) > 0 && rest[0] == "whatif" {
			return whatifCommand(ctx, rest[1:], stdout, stderr)
		}
		if len(rest) > 0 && rest[0] == "advise" {
			return adviseCommand(ctx, rest[1:], stdout, stderr)
		}
		return policyCommand(rest, stdin, stdout, stderr)
	case "cost":
		return costCommand(ctx, rest, stdout, stderr)
	case "topics":
		return topicsVerb(ctx, rest, stdout, stderr)
	case "schemas":
		return schemasCommand(ctx, rest, stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, "faultrouter", version)
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("unknown verb %q", verb)
	}
}
