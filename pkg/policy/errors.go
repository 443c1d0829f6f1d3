package policy

import (
	"errors"
	"strconv"
)

// ErrInvalid is wrapped by every error of Validate, Parse and Load: the policy
// file is unusable. Use errors.As with *FieldError for the field.
var ErrInvalid = errors.New("policy: invalid policy")

// FieldError names the policy field that is wrong and what is allowed. Its
// message reads
//
//	policy: FILE:LINE: network_timeout.max_retries: must be >= 0, got -1
//
// where FILE and LINE appear when known.
type FieldError struct {
	// File is the policy file, when the policy came from Load.
	File string
	// Line is the line of the field in the file; 0 when unknown.
	Line int
	// Path is the field's key path, e.g. "validation_fixable.ranges[1].to".
	Path string
	// Msg says what is wrong and what is allowed.
	Msg string
}

func (e *FieldError) Error() string {
	s := "policy: "
	if e.File != "" {
		s += e.File
		if e.Line > 0 {
			s += ":" + strconv.Itoa(e.Line)
		}
		s += ": "
	} else if e.Line > 0 {
		s += "line " + strconv.Itoa(e.Line) + ": "
	}
	if e.Path != "" {
		s += e.Path + ": "
	}
	return s + e.Msg
}

// Unwrap makes every FieldError match ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }
