package logging

// fasttext.go formats the lines the router logs on its hot path (a line
// per decision: a message and a few strings and numbers) byte for byte as
// slog's TextHandler does, without its general machinery: the TextHandler
// spent about as long formatting such a line as the router spent deciding
// the event. A line the fast path does not cover (a group, a value of
// another kind, an attribute without a key, a ReplaceAttr or AddSource
// option) goes to the TextHandler. TestFastTextMatchesTextHandler holds the
// two to the same output.

import (
	"log/slog"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// fastKind reports whether the fast path formats a value of kind k.
func fastKind(k slog.Kind) bool {
	switch k {
	case slog.KindString, slog.KindInt64, slog.KindUint64, slog.KindFloat64, slog.KindBool, slog.KindDuration, slog.KindTime:
		return true
	}
	return false
}

// fastAttrs reports whether the fast path formats every attribute of r.
func fastAttrs(r *slog.Record) bool {
	ok := true
	r.Attrs(func(a slog.Attr) bool {
		ok = a.Key != "" && fastKind(a.Value.Kind())
		return ok
	})
	return ok
}

// appendFastAttrs appends " key=value" for each of attrs; ok is false,
// and b unchanged, if one is not for the fast path.
func appendFastAttrs(b []byte, attrs []slog.Attr) (_ []byte, ok bool) {
	for _, a := range attrs {
		if a.Key == "" || !fastKind(a.Value.Kind()) {
			return b, false
		}
	}
	for _, a := range attrs {
		b = appendFastAttr(b, a)
	}
	return b, true
}

func appendFastAttr(b []byte, a slog.Attr) []byte {
	b = append(b, ' ')
	b = appendTextString(b, a.Key)
	b = append(b, '=')
	v := a.Value
	switch v.Kind() {
	case slog.KindString:
		return appendTextString(b, v.String())
	case slog.KindInt64:
		return strconv.AppendInt(b, v.Int64(), 10)
	case slog.KindUint64:
		return strconv.AppendUint(b, v.Uint64(), 10)
	case slog.KindFloat64:
		return strconv.AppendFloat(b, v.Float64(), 'g', -1, 64)
	case slog.KindBool:
		return strconv.AppendBool(b, v.Bool())
	case slog.KindDuration:
		return append(b, v.Duration().String()...)
	default: // slog.KindTime
		return appendRFC3339Millis(b, v.Time())
	}
}

// appendFastLine appends r as the TextHandler writes it, with pre (the
// attributes of WithAttrs, formatted by appendFastAttrs) after the
// message.
func appendFastLine(b []byte, r *slog.Record, pre []byte) []byte {
	sep := ""
	if !r.Time.IsZero() {
		b = append(b, "time="...)
		b = appendRFC3339Millis(b, r.Time.Round(0))
		sep = " "
	}
	b = append(b, sep...)
	b = append(b, "level="...)
	b = appendTextString(b, r.Level.String())
	b = append(b, " msg="...)
	b = appendTextString(b, r.Message)
	b = append(b, pre...)
	r.Attrs(func(a slog.Attr) bool {
		b = appendFastAttr(b, a)
		return true
	})
	return append(b, '\n')
}

// appendTextString appends s, quoted if the TextHandler would quote it.
func appendTextString(b []byte, s string) []byte {
	quote, escape := len(s) == 0, false
	for i := 0; i < len(s); i++ {
		switch asciiClass[s[i]] {
		case asciiQuote:
			quote = true
		case asciiEscape:
			quote, escape = true, true
		case asciiBackslash:
			escape = true
		case asciiOther: // a control character or a multi-byte rune: the general rules
			if needsQuoting(s) {
				return strconv.AppendQuote(b, s)
			}
			return append(b, s...)
		}
	}
	switch {
	case !quote:
		return append(b, s...)
	case !escape:
		return append(append(append(b, '"'), s...), '"')
	}
	// printable ASCII, as strconv.Quote writes it: '"' and '\\' escaped
	b = append(b, '"')
	for {
		i := strings.IndexAny(s, `"\\`)
		if i < 0 {
			break
		}
		b = append(append(b, s[:i]...), '\\', s[i])
		s = s[i+1:]
	}
	return append(append(b, s...), '"')
}

// The classes of a byte for appendTextString.
const (
	asciiSafe      = iota // printable ASCII written as it is
	asciiQuote            // ' ' and '=': the string is quoted
	asciiEscape           // '"': the string is quoted, and '"' and '\\' escaped
	asciiBackslash        // '\\': written as it is, escaped if the string is quoted
	asciiOther            // a control character or a byte of a multi-byte rune
)

var asciiClass = func() (c [256]uint8) {
	for i := range c {
		switch {
		case i < 0x20 || i > 0x7e:
			c[i] = asciiOther
		case i == ' ' || i == '=':
			c[i] = asciiQuote
		case i == '"':
			c[i] = asciiEscape
		case i == '\\':
			c[i] = asciiBackslash
		}
	}
	return c
}()

// needsQuoting is the TextHandler's rule: empty, a space, '=', '"', a
// control character, or a rune that is not printable or is a space.
func needsQuoting(s string) bool {
	if len(s) == 0 {
		return true
	}
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c == ' ' || c == '=' || c == '"' || c < 0x20 {
				return true
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return true
		}
		i += size
	}
	return false
}

// appendRFC3339Millis is the TextHandler's time format: RFC 3339 with
// exactly three digits of milliseconds.
func appendRFC3339Millis(b []byte, t time.Time) []byte {
	const prefixLen = len("2006-01-02T15:04:05.000")
	n := len(b)
	t = t.Truncate(time.Millisecond).Add(time.Millisecond / 10)
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b[:n+prefixLen], b[n+prefixLen+1:]...) // drop the fourth digit
}
