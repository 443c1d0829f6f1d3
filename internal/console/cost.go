package console

// cost.go: the Cost page. The view sums the cost ledger (internal/ledger) of
// every audit record it reads, per hour of the decision, counting as the
// ledger does (each attempt once: not a forward, a re-drive or a redelivery
// after the TTL again): spend by class, failed spend by provider/model and
// prompt template, and the cost the router's stops prevented (the claims of
// the audit records' decision.prevented, else, for records of builds that
// wrote none, the console's policy's baseline). The page draws, for a range of hours, spend
// stacked by class and cost prevented per hour as SVG written by the server
// (no script, no library: it works offline and under the page's CSP), and
// lists the provider/models and templates with the most failed spend.
//
// Keys (view.go): cost/<hour:16 hex>/c/<class>, .../m/<provider/model>,
// .../t/<template> -> costSums (JSON), pruned with the view's retention. A
// view built by an earlier build has no cost keys for the records it had
// read: remove its directory to rebuild.

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/ledger"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// costSums are the ledger's sums of one key in one hour; money in
// micro-dollars.
type costSums struct {
	Attempts     int64 `json:"a"`
	Failed       int64 `json:"f"`
	Micros       int64 `json:"c"`
	FailedMicros int64 `json:"fc"`
	Stops        int64 `json:"s"`
	Prevented    int64 `json:"p"`
}

func (c *costSums) add(o costSums) {
	c.Attempts += o.Attempts
	c.Failed += o.Failed
	c.Micros += o.Micros
	c.FailedMicros += o.FailedMicros
	c.Stops += o.Stops
	c.Prevented += o.Prevented
}

// accountCost adds one audit record (its headers say whether its attempt
// repeats one already counted: ledger.RepeatOf) to the hour of its
// decision, as internal/ledger counts it: the usage of each attempt once,
// and the cost prevented the decision claims (netted off when negative).
func (s *Server) accountCost(b *batch, r *event.Routed, headers []kgo.RecordHeader, ts time.Time) error {
	d := &r.Decision
	if !ledger.TaskEvent(r.Event, d) {
		return nil
	}
	var one costSums
	if ledger.Counts(r.Event, d, ledger.RepeatOf(d, headers)) {
		one.Attempts, one.Micros = 1, ledger.Micros(r.Event.Usage.CostUSD)
		if d.Class != event.ClassSucceeded {
			one.Failed, one.FailedMicros = 1, one.Micros
		}
	}
	if p := d.Prevented; p != nil {
		one.Prevented = ledger.Micros(p.USD)
		if _, ok := policy.StopOf(d); ok {
			one.Stops = 1
		}
	} else if p, ok := s.cfg.Policy.PreventedBy(d); ok {
		one.Stops, one.Prevented = 1, ledger.Micros(p.USD)
	}
	if one == (costSums{}) {
		return nil
	}
	hour := "cost/" + timeKey(ts.Truncate(time.Hour).UnixMilli()) + "/"
	tmpl := r.Event.PromptTemplate
	if tmpl == "" {
		tmpl = ledger.None
	}
	for _, k := range []string{hour + "c/" + string(d.Class), hour + "m/" + ledger.ModelKey(r.Event), hour + "t/" + tmpl} {
		var sum costSums
		if _, err := b.get(k, &sum); err != nil {
			return err
		}
		sum.add(one)
		if err := b.put(k, sum); err != nil {
			return err
		}
	}
	return nil
}

// costRanges are the ranges the page offers, in hours.
var costRanges = []int{6, 24, 168, 720}

// costPage is the data of the Cost page.
type costPage struct {
	Hours                               int
	Ranges                              []int
	From, To                            time.Time
	Total, Failed, Succeeded, Prevented string
	Attempts, FailedAttempts, Stops     int64
	Spend, Saved                        chart
	Legend                              []legendItem
	Models, Templates                   []costRow
	HasData                             bool
}

type legendItem struct{ Class, Color string }

// chart is one SVG bar chart: bars of stacked segments, one per hour.
type chart struct {
	Width, Height int
	Box           string // the SVG viewBox: the chart and a line of labels
	Bars          []bar
	Max           string   // the top of the scale, in dollars
	Ticks         []string // hour labels under some bars
	TickX         []int
}

type bar struct{ Segments []segment }

type segment struct {
	X, Y, W, H int
	Color      string
	Title      string
}

// costRow is one provider/model or template by failed spend.
type costRow struct {
	Key                string
	Attempts, Failed   int64
	Spend, FailedSpend string
	Prevented          string
	BarW               int
}

// classColors gives every class a fixed color: successes green, the
// classes people act on warm, the rest cool.
var classColors = map[event.Class]string{
	event.ClassSucceeded: "#3a9a5b", event.ClassNetworkTimeout: "#6b8fd6", event.ClassAuthFailed: "#8e6bd6",
	event.ClassInputQuality: "#b58bd6", event.ClassModelRefusal: "#e0883a", event.ClassSchemaViolation: "#e8a86a",
	event.ClassValidationFixable: "#d6c04b", event.ClassDuplicateExecution: "#9aa4b2", event.ClassBusinessRejected: "#c7795b",
	event.ClassHallucination: "#b3261e", event.ClassRateLimited: "#4bb3c7", event.ClassRateLimitExceeded: "#2f7f91",
	event.ClassBudgetExhausted: "#d6457a", event.ClassOutcomeUnknown: "#7a5230", event.ClassParamsMismatch: "#a65c8f",
	event.ClassUnclassified: "#5d6878", event.ClassInvalidInput: "#333b47",
}

const (
	chartW, chartH = 1000, 220
	preventColor   = "#1e7a3c"
)

func (s *Server) costPage(w http.ResponseWriter, r *http.Request, p *person) error {
	hours := 24
	if h := r.URL.Query().Get("hours"); h != "" {
		n, err := strconv.Atoi(h)
		if err != nil || !slices.Contains(costRanges, n) {
			return badRequest(fmt.Sprintf("hours=%q: allowed %v", h, costRanges))
		}
		hours = n
	}
	to := time.Now().Truncate(time.Hour).Add(time.Hour)
	from := to.Add(-time.Duration(hours) * time.Hour)
	byHour := make([]map[event.Class]costSums, hours)
	models, tmpls := map[string]*costSums{}, map[string]*costSums{}
	var total costSums
	prefix := "cost/"
	// the range's hours only: the index is read from where the range
	// begins (and pruned with the view's retention)
	err := s.view.eachRange(prefix+timeKey(from.UnixMilli()), prefix+timeKey(to.UnixMilli()), false, func(k string, val []byte) bool {
		rest := strings.TrimPrefix(k, prefix)
		if len(rest) < 19 || rest[16] != '/' || rest[18] != '/' {
			return true
		}
		ms, err := strconv.ParseUint(rest[:16], 16, 64)
		if err != nil {
			return true
		}
		i := int(time.UnixMilli(int64(ms)).Sub(from) / time.Hour)
		if i < 0 || i >= hours {
			return true
		}
		var sum costSums
		if json.Unmarshal(val, &sum) != nil {
			return true
		}
		name := rest[19:]
		switch rest[17] {
		case 'c':
			if byHour[i] == nil {
				byHour[i] = map[event.Class]costSums{}
			}
			byHour[i][event.Class(name)] = sum
			total.add(sum)
		case 'm':
			addTo(models, name, sum)
		case 't':
			addTo(tmpls, name, sum)
		}
		return true
	})
	if err != nil {
		return err
	}
	pg := costPage{Hours: hours, Ranges: costRanges, From: from, To: to, HasData: total.Attempts > 0,
		Total: dollars(total.Micros), Failed: dollars(total.FailedMicros), Succeeded: dollars(total.Micros - total.FailedMicros),
		Prevented: dollars(total.Prevented), Attempts: total.Attempts, FailedAttempts: total.Failed, Stops: total.Stops}
	pg.Spend, pg.Legend = spendChart(byHour, from)
	pg.Saved = preventedChart(byHour, from)
	pg.Models, pg.Templates = topRows(models), topRows(tmpls)
	s.render(w, r, p, "cost", http.StatusOK, "Cost", "cost", pg)
	return nil
}

func addTo(m map[string]*costSums, k string, s costSums) {
	if m[k] == nil {
		m[k] = &costSums{}
	}
	m[k].add(s)
}

func dollars(micros int64) string { return ledger.Dollars(float64(micros) / 1e6) }

// spendChart stacks each hour's spend by class, in the order of
// event.Classes, and returns the legend of the classes present.
func spendChart(byHour []map[event.Class]costSums, from time.Time) (chart, []legendItem) {
	var top int64
	present := map[event.Class]bool{}
	for _, h := range byHour {
		var n int64
		for c, s := range h {
			n += s.Micros
			present[c] = true
		}
		top = max(top, n)
	}
	c := newChart(len(byHour), top, from)
	bw := c.Width / max(len(byHour), 1)
	for i, h := range byHour {
		y := chartH
		var b bar
		for _, cl := range event.Classes {
			s, ok := h[cl]
			if !ok || s.Micros == 0 {
				continue
			}
			hgt := scale(s.Micros, top)
			y -= hgt
			b.Segments = append(b.Segments, segment{X: i*bw + 1, Y: y, W: max(bw-2, 1), H: hgt, Color: classColors[cl],
				Title: fmt.Sprintf("%s %s: %s (%d attempts)", from.Add(time.Duration(i)*time.Hour).UTC().Format("01-02 15:00"), cl, dollars(s.Micros), s.Attempts)})
		}
		c.Bars = append(c.Bars, b)
	}
	var legend []legendItem
	for _, cl := range event.Classes {
		if present[cl] {
			legend = append(legend, legendItem{Class: string(cl), Color: classColors[cl]})
		}
	}
	return c, legend
}

// preventedChart draws the cost prevented of each hour.
func preventedChart(byHour []map[event.Class]costSums, from time.Time) chart {
	per := make([]int64, len(byHour))
	var top int64
	for i, h := range byHour {
		for _, s := range h {
			per[i] += s.Prevented
		}
		top = max(top, per[i])
	}
	c := newChart(len(byHour), top, from)
	bw := c.Width / max(len(byHour), 1)
	for i, n := range per {
		var b bar
		if n > 0 {
			hgt := scale(n, top)
			b.Segments = []segment{{X: i*bw + 1, Y: chartH - hgt, W: max(bw-2, 1), H: hgt, Color: preventColor,
				Title: fmt.Sprintf("%s: %s prevented", from.Add(time.Duration(i)*time.Hour).UTC().Format("01-02 15:00"), dollars(n))}}
		}
		c.Bars = append(c.Bars, b)
	}
	return c
}

func newChart(n int, top int64, from time.Time) chart {
	c := chart{Width: chartW, Height: chartH, Max: dollars(top), Box: fmt.Sprintf("0 0 %d %d", chartW, chartH+20)}
	bw := chartW / max(n, 1)
	step := max(1, n/8)
	for i := 0; i < n; i += step {
		c.Ticks = append(c.Ticks, from.Add(time.Duration(i)*time.Hour).UTC().Format("01-02 15h"))
		c.TickX = append(c.TickX, i*bw)
	}
	return c
}

// scale is the height of v on a chart whose top is top; at least 1 pixel
// for anything spent.
func scale(v, top int64) int {
	if top <= 0 || v <= 0 {
		return 0
	}
	return max(1, int(v*int64(chartH-10)/top))
}

// topRows lists the ten keys with the most failed spend.
func topRows(m map[string]*costSums) []costRow {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		return cmp.Or(cmp.Compare(m[b].FailedMicros, m[a].FailedMicros), cmp.Compare(a, b))
	})
	keys = keys[:min(len(keys), 10)]
	var top int64
	for _, k := range keys {
		top = max(top, m[k].FailedMicros)
	}
	var out []costRow
	for _, k := range keys {
		s := m[k]
		w := 0
		if top > 0 {
			w = int(s.FailedMicros * 200 / top)
		}
		out = append(out, costRow{Key: k, Attempts: s.Attempts, Failed: s.Failed, Spend: dollars(s.Micros),
			FailedSpend: dollars(s.FailedMicros), Prevented: dollars(s.Prevented), BarW: w})
	}
	return out
}
