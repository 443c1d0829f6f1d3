package topicspec

import "errors"

// ErrInvalidSpec is returned by Load and Validate when a topic specification is
// malformed: an unknown field, a missing file, a bad name, a count below 1, or
// co-partitioned topics declared with different partition counts.
var ErrInvalidSpec = errors.New("topicspec: invalid topic spec")

// ErrUnknownTopic is returned by Set.Name and Set.Spec for a short name that is
// not one of the topics in topics/.
var ErrUnknownTopic = errors.New("topicspec: unknown topic")

// ErrMismatch is wrapped by the *CheckError that Set.Ensure returns when the
// cluster's topics contradict the spec.
var ErrMismatch = errors.New("topicspec: topics contradict the spec")
