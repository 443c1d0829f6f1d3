package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/avro"
	"github.com/faultrouter/faultrouter/internal/registry"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

const produceSynopsis = `usage: faultrouter produce [--topic ingress|decisions] [--file F]

Reads JSON lines (TaskEvent for ingress, ReviewDecision for decisions; the
field names of avro/*.avsc; docs/design.md) from --file or stdin, validates every line first and
produces nothing if any line is bad, naming the line and the field. Then
produces them as Avro single-object records keyed by task_id.`

func produceCommand(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs, g := newFlagSet("produce", produceSynopsis, stderr)
	topic := fs.String("topic", string(topicspec.Ingress), "short topic name: ingress or decisions")
	file := fs.String("file", "-", "file of JSON lines; - for stdin")
	regFlags := addRegistryFlags(fs, true)
	if err := fs.Parse(args); err != nil {
		return err
	}
	wire, err := regFlags.wire()
	if err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	short := topicspec.Short(*topic)
	if short != topicspec.Ingress && short != topicspec.Decisions {
		return fmt.Errorf("produce: --topic %q: allowed ingress, decisions", *topic)
	}
	in := stdin
	if *file != "-" {
		f, err := os.Open(*file)
		if err != nil {
			return fmt.Errorf("produce: --file: %w", err)
		}
		defer f.Close()
		in = f
	}
	c, err := codec.New()
	if err != nil {
		return err
	}
	recs, err := encodeLines(c, in, short == topicspec.Decisions)
	if err != nil {
		return fmt.Errorf("produce: nothing sent: %w", err)
	}
	set, err := g.topics()
	if err != nil {
		return err
	}
	name, err := set.Name(short)
	if err != nil {
		return err
	}
	if wire == registry.Confluent {
		if err := frameRecords(ctx, regFlags, c, name, short == topicspec.Decisions, recs); err != nil {
			return fmt.Errorf("produce: nothing sent: %w", err)
		}
	}
	opts, err := g.clientOpts(nil)
	if err != nil {
		return err
	}
	if err := g.requireTopics(ctx, "produce", opts, name); err != nil {
		return err
	}
	cl, err := kgo.NewClient(append(opts, kgo.DefaultProduceTopic(name), kgo.RecordDeliveryTimeout(30*time.Second))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	fmt.Fprintf(stdout, "produced %d records to %s\n", len(recs), name)
	return nil
}

// encodeLines validates and encodes every line; the first bad line is an
// error naming its number and field.
func encodeLines(c *codec.Codec, r io.Reader, decisions bool) ([]*kgo.Record, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var recs []*kgo.Record
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		var (
			key string
			v   []byte
			err error
		)
		if decisions {
			var d event.ReviewDecision
			if d, err = event.ParseReviewDecisionJSON(line); err == nil {
				key = d.TaskID
				v, err = c.EncodeReviewDecision(nil, &d)
			}
		} else {
			var e event.TaskEvent
			if e, err = event.ParseTaskEventJSON(line); err == nil {
				key = e.TaskID
				v, err = c.EncodeTaskEvent(nil, &e)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		recs = append(recs, &kgo.Record{Key: []byte(key), Value: v})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return recs, nil
}

// frameRecords rewrites recs into the Confluent wire format, with the ID
// of their schema under the topic's subject (registered if it is not).
func frameRecords(ctx context.Context, f *registryFlags, c *codec.Codec, topic string, decisions bool, recs []*kgo.Record) error {
	name := avro.TaskEvent
	if decisions {
		name = avro.ReviewDecision
	}
	frame, err := f.framer(ctx, c, topic, name)
	if err != nil {
		return err
	}
	for _, rec := range recs {
		rec.Value = frame(topic, rec.Value)
	}
	return nil
}
