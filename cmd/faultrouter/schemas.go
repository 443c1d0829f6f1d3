package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/linkedin/goavro/v2"

	"github.com/faultrouter/faultrouter/internal/registry"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

const schemasSynopsis = `usage: faultrouter schemas register|check --registry URL [--topic T --file F] [--compatibility LEVEL]

Registers the schemas faultrouter reads and writes in a schema registry (the
Confluent Schema Registry API: Confluent's, or Apicurio's at
/apis/ccompat/v7), or checks them for compatibility with what is registered
before a deploy. Subjects follow TopicNameStrategy, <topic>-value:

  ingress     TaskEvent            decisions   ReviewDecision
  retry, review, audit, deadletter  RoutedRecord
  alerts      BreakerEvent

With --topic and --file, only the schema in the file is registered or
checked, under that topic's subject: how a worker's team checks an evolved
TaskEvent before it ships. check exits 1 when a schema is incompatible,
naming the field that breaks compatibility, and 2 when the registry cannot
be asked.`

// errIncompatible makes schemas check exit 1.
var errIncompatible = errors.New("schemas check: incompatible schema")

func schemasCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "register" && args[0] != "check") {
		fmt.Fprintln(stderr, schemasSynopsis)
		return errors.New("schemas: the subcommands are register and check")
	}
	sub := args[0]
	fs, g := newFlagSet("schemas "+sub, schemasSynopsis, stderr)
	regFlags := addRegistryFlags(fs, false)
	fs.StringVar(&regFlags.url, "registry", regFlags.url, "same as --registry-url")
	topic := fs.String("topic", "", "short topic name of --file's schema (ingress, decisions, retry, review, audit, deadletter, alerts)")
	file := fs.String("file", "", "Avro schema file (.avsc) to register or check instead of faultrouter's own; needs --topic")
	compat := fs.String("compatibility", "", "register: also set each subject's compatibility level (e.g. BACKWARD, FULL); default: leave it to the registry's")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if regFlags.url == "" {
		return fmt.Errorf("schemas %s: --registry is required (the registry's base URL)", sub)
	}
	if (*topic == "") != (*file == "") {
		return fmt.Errorf("schemas %s: --topic and --file go together", sub)
	}
	c, err := codec.New()
	if err != nil {
		return err
	}
	reg, err := regFlags.client(c)
	if err != nil {
		return fmt.Errorf("schemas %s: %w", sub, err)
	}
	set, err := g.topics()
	if err != nil {
		return err
	}
	var list []registry.TopicSchema
	if *file != "" {
		name, err := set.Name(topicspec.Short(*topic))
		if err != nil {
			return fmt.Errorf("schemas %s: --topic: %w", sub, err)
		}
		text, err := os.ReadFile(*file)
		if err != nil {
			return fmt.Errorf("schemas %s: --file: %w", sub, err)
		}
		if _, err := goavro.NewCodec(string(text)); err != nil {
			return fmt.Errorf("schemas %s: --file %s: not an Avro schema: %w", sub, *file, err)
		}
		list = []registry.TopicSchema{{Topic: name, Schema: string(text)}}
	} else {
		t := set.Topics()
		list, err = registry.Schemas{Ingress: t.Ingress, Decisions: t.Decisions, Retry: t.Retry, Review: t.Review,
			Audit: t.Audit, DeadLetter: t.DeadLetter, Alerts: t.Alerts}.TopicSchemas()
		if err != nil {
			return err
		}
	}
	bad := 0
	for _, ts := range list {
		subject := registry.Subject(ts.Topic)
		var ie *registry.IncompatibleError
		if sub == "register" {
			if *compat != "" {
				if err := reg.SetCompatibility(ctx, ts.Topic, *compat); err != nil {
					if errors.Is(err, registry.ErrUnavailable) {
						return unreachable(sub, err)
					}
					return fmt.Errorf("schemas register: --compatibility: %w", err)
				}
			}
			id, err := reg.Register(ctx, ts.Topic, ts.Schema)
			switch {
			case errors.As(err, &ie):
				bad++
				fmt.Fprintf(stdout, "refused    %v\n", ie)
			case err != nil:
				return unreachable(sub, err)
			default:
				fmt.Fprintf(stdout, "registered %s: schema ID %d\n", subject, id)
			}
			continue
		}
		err := reg.Check(ctx, ts.Topic, ts.Schema)
		switch {
		case errors.As(err, &ie):
			bad++
			fmt.Fprintf(stdout, "INCOMPATIBLE %v\n", ie)
		case err != nil:
			return unreachable(sub, err)
		default:
			level, err := reg.Level(ctx, ts.Topic)
			switch {
			case err != nil:
				return unreachable(sub, err)
			case level == "NONE":
				fmt.Fprintf(stdout, "compatible   %s (level NONE: the registry checks nothing; set a level with schemas register --compatibility)\n", subject)
			default:
				fmt.Fprintf(stdout, "compatible   %s (level %s)\n", subject, level)
			}
		}
	}
	if bad > 0 {
		return fmt.Errorf("%w: %d of %d subjects", errIncompatible, bad, len(list))
	}
	return nil
}

// errUnreachable makes schemas exit 2: the registry could not be asked.
type errUnreachable struct{ err error }

func (e errUnreachable) Error() string { return e.err.Error() }
func (e errUnreachable) Unwrap() error { return e.err }

func unreachable(sub string, err error) error {
	return errUnreachable{fmt.Errorf("schemas %s: %w", sub, err)}
}
