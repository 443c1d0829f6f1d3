package codec

import (
	"sync"

	"github.com/faultrouter/faultrouter/pkg/event"
)

// teNative is the goavro native form of one TaskEvent, kept between encodes:
// every record and union wrapper map is allocated once per pooled value and
// overwritten, so an encode allocates only the boxed field values.
type teNative struct {
	top, usage                           map[string]any
	stage, errW, errR, outW, outR        map[string]any
	opW, opR, refW, refR                 map[string]any
	provider, model, template, sla       map[string]any
	eType, eHTTP, eCode, eMsg, eRetry    map[string]any
	oText, oValid, oConf, opParams, rSHA map[string]any
	rSize                                map[string]any
	attrs                                map[string]any
	flags                                []any
}

var teNatives = sync.Pool{New: func() any { return newTENative() }}

func newTENative() *teNative {
	m := func(n int) map[string]any { return make(map[string]any, n) }
	n := &teNative{
		top: m(20), usage: m(3),
		stage: m(1), errW: m(1), errR: m(5), outW: m(1), outR: m(4),
		opW: m(1), opR: m(4), refW: m(1), refR: m(3),
		provider: m(1), model: m(1), template: m(1), sla: m(1),
		eType: m(1), eHTTP: m(1), eCode: m(1), eMsg: m(1), eRetry: m(1),
		oText: m(1), oValid: m(1), oConf: m(1), opParams: m(1), rSHA: m(1), rSize: m(1),
		attrs: m(8),
	}
	n.errW["faultrouter.Error"] = n.errR
	n.outW["faultrouter.Output"] = n.outR
	n.opW["faultrouter.Operation"] = n.opR
	n.refW["faultrouter.InputRef"] = n.refR
	return n
}

// wrap sets the single branch of a reusable union wrapper and returns it.
func wrap(w map[string]any, branch string, v any) any {
	w[branch] = v
	return w
}

func wrapStr(w map[string]any, s string) any {
	if s == "" {
		return nil
	}
	return wrap(w, "string", s)
}

func wrapLong(w map[string]any, p *int64) any {
	if p == nil {
		return nil
	}
	return wrap(w, "long", *p)
}

// fill writes e into n's maps and returns the top-level record.
func (n *teNative) fill(e *event.TaskEvent) map[string]any {
	m := n.top
	m["event_id"] = e.EventID
	m["task_id"] = e.TaskID
	m["attempt"] = e.Attempt
	m["occurred_at"] = e.OccurredAt.Millis()
	m["source"] = e.Source
	m["action"] = e.Action
	m["provider"] = wrapStr(n.provider, e.Provider)
	m["model"] = wrapStr(n.model, e.Model)
	m["prompt_template"] = wrapStr(n.template, e.PromptTemplate)
	m["stage"] = nil
	if e.Stage != "" {
		m["stage"] = wrap(n.stage, "faultrouter.Stage", string(e.Stage))
	}
	m["status"] = string(e.Status)
	m["error"] = nil
	if x := e.Error; x != nil {
		r := n.errR
		r["type"] = wrapStr(n.eType, x.Type)
		r["http_status"] = nil
		if x.HTTPStatus != 0 {
			r["http_status"] = wrap(n.eHTTP, "int", x.HTTPStatus)
		}
		r["code"] = wrapStr(n.eCode, x.Code)
		r["message"] = wrapStr(n.eMsg, x.Message)
		r["retry_after_ms"] = wrapLong(n.eRetry, x.RetryAfterMs)
		m["error"] = n.errW
	}
	m["output"] = nil
	if o := e.Output; o != nil {
		r := n.outR
		r["text"] = wrapStr(n.oText, o.Text)
		r["schema_valid"] = nil
		if o.SchemaValid != nil {
			r["schema_valid"] = wrap(n.oValid, "boolean", *o.SchemaValid)
		}
		r["confidence"] = nil
		if o.Confidence != nil {
			r["confidence"] = wrap(n.oConf, "double", *o.Confidence)
		}
		n.flags = n.flags[:0]
		for _, f := range o.Flags {
			n.flags = append(n.flags, f)
		}
		r["flags"] = n.flags
		m["output"] = n.outW
	}
	n.usage["cost_usd"] = e.Usage.CostUSD
	n.usage["tokens"] = e.Usage.Tokens
	n.usage["elapsed_ms"] = e.Usage.ElapsedMs
	m["usage"] = n.usage
	m["operation"] = nil
	if op := e.Operation; op != nil {
		r := n.opR
		r["op_id"] = op.OpID
		r["kind"] = string(op.Kind)
		r["params_sha256"] = wrapStr(n.opParams, op.ParamsSHA256)
		r["state"] = string(op.State)
		m["operation"] = n.opW
	}
	m["input_ref"] = nil
	if ref := e.InputRef; ref != nil {
		r := n.refR
		r["uri"] = ref.URI
		r["sha256"] = wrapStr(n.rSHA, ref.SHA256)
		r["size_bytes"] = nil
		if ref.SizeBytes != 0 {
			r["size_bytes"] = wrap(n.rSize, "long", ref.SizeBytes)
		}
		m["input_ref"] = n.refW
	}
	m["sla_ms"] = wrapLong(n.sla, e.SLAMs)
	clear(n.attrs)
	for k, v := range e.Attributes {
		n.attrs[k] = v
	}
	m["attributes"] = n.attrs
	return m
}

// release drops the references to e's values and returns n to the pool.
func (n *teNative) release() {
	clear(n.attrs)
	clear(n.flags)
	n.flags = n.flags[:0]
	teNatives.Put(n)
}
