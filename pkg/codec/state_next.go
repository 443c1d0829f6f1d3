//go:build nextstate

package codec

import (
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/linkedin/goavro/v2"

	"github.com/faultrouter/faultrouter/avro"
)

// This file makes a build outside the upgrade window, built only with the
// nextstate tag by the integration test of a restore that meets a state it
// cannot read (integration/unreadable_test.go): it writes every task state
// with a TaskState schema one version past the current one (the current
// fields and one more, next_release, null), which a release build does not
// know; it reads both. Never build a release with this tag.

var nextStateFP uint64

func (c *Codec) addNextState() error {
	var s map[string]any
	if err := json.Unmarshal([]byte(c.state.json), &s); err != nil {
		return err
	}
	fields, _ := s["fields"].([]any)
	s["fields"] = append(fields, map[string]any{"name": "next_release", "type": []any{"null", "string"}, "default": nil})
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	fp, err := avro.SchemaFingerprint(string(b))
	if err != nil {
		return err
	}
	gc, err := goavro.NewCodec(string(b))
	if err != nil {
		return fmt.Errorf("codec: the next TaskState schema: %w", err)
	}
	c.writers[fp] = &writer{name: avro.TaskState, version: c.state.version + 1, fp: fp, codec: gc, json: string(b)}
	nextStateFP = fp
	return nil
}

// asNextState turns the current-schema state encoded at out[at:] into the
// next schema's encoding: its fingerprint, and the extra field (null: union
// branch 0) after the current fields.
func (c *Codec) asNextState(out []byte, at int) []byte {
	if nextStateFP == 0 || len(out) < at+headerLen { // (while New checks its own readers)
		return out
	}
	binary.LittleEndian.PutUint64(out[at+2:at+10], nextStateFP)
	return append(out, 0)
}
