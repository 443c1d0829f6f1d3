package codec_test

import (
	"fmt"
	"time"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// Encode a TaskEvent for the ingress topic, decode it back, and classify a
// poison record for the dead-letter headers.
func Example() {
	c, err := codec.New()
	if err != nil {
		panic(err)
	}
	e := event.TaskEvent{
		EventID: "ev-1", TaskID: "task-1", Attempt: 1,
		OccurredAt: event.At(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)),
		Source:     "refund-worker", Action: "refund", Status: event.StatusOK,
	}
	b, err := c.EncodeTaskEvent(nil, &e)
	if err != nil {
		panic(err)
	}
	fmt.Printf("header % x\n", b[:2])
	v, err := c.Decode(b)
	fmt.Println(v.(*event.TaskEvent).TaskID, err)

	_, err = c.Decode([]byte("not avro"))
	fmt.Println(codec.Kind(err))
	// Output:
	// header c3 01
	// task-1 <nil>
	// not_single_object
}
