package codec

// WriterVersion returns the record name and schema version a single-object
// encoded b was written with, from its header alone: a reader tells apart
// what an older build wrote (a RoutedRecord of version 1 has no
// decision.prevented) from a field missing by mistake.
func (c *Codec) WriterVersion(b []byte) (name string, version int, err error) {
	w, err := c.writerOf(b)
	if err != nil {
		return "", 0, err
	}
	return w.name, w.version, nil
}
