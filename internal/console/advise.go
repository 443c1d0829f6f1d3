package console

// advise.go: the Advise page. An operator picks a range; the console runs
// the policy advisor over it (internal/advise, the code of `faultrouter
// policy advise`, with the policy it runs with as the running policy) and
// shows each proposal with its evidence and a plot (success by retry number
// for a max_retries change, approval rate by confidence band for a
// min_confidence change, the waits against the SLA for an owner's SLA), the
// candidate policy, its what-if against the running policy, and a button
// that opens the What-if page with the candidate. Like a what-if, it reads
// up to a week of three topics: operators only, one at a time per console.

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/faultrouter/faultrouter/internal/advise"
	"github.com/faultrouter/faultrouter/internal/ledger"
	"github.com/faultrouter/faultrouter/internal/whatif"
)

// advisePage is the data of the Advise page.
type advisePage struct {
	Hours     int
	Ranges    []int
	Ran       bool
	Report    *advise.Report
	Proposals []proposalView
	Candidate string
	Whatif    *whatif.Report
	WhatifErr string
	Owners    []pairBar
	Cost      []pairBar
}

// proposalView is one proposal and its plot.
type proposalView struct {
	advise.Proposal
	Plot plot
}

// plot is an inline SVG chart: bars with an optional interval whisker, and
// vertical marks.
type plot struct {
	W, H    int
	Caption string
	Bars    []plotBar
	Marks   []plotMark
}

type plotBar struct {
	X, Y, W, H int
	Label      string
	Title      string
	Class      string
	// Whisker draws the 95% interval from WY1 to WY2 at the bar's middle.
	Whisker  bool
	WX       int
	WY1, WY2 int
}

type plotMark struct {
	X     int
	Label string
	Class string
}

const (
	plotW, plotH, plotTop, plotBase = 440, 190, 16, 160 // the bars stand on plotBase
)

func (s *Server) adviseForm(w http.ResponseWriter, r *http.Request, p *person) error {
	s.render(w, r, p, "advise", http.StatusOK, "Advise", "advise", advisePage{Hours: 168, Ranges: whatifRanges})
	return nil
}

func (s *Server) adviseRun(w http.ResponseWriter, r *http.Request, p *person) error {
	if err := needOperator(p, "running the advisor"); err != nil {
		return err
	}
	pg := advisePage{Hours: 168, Ranges: whatifRanges, Ran: true}
	if h := r.PostFormValue("hours"); h != "" {
		n, err := strconv.Atoi(h)
		if err != nil || !slices.Contains(whatifRanges, n) {
			return badRequest(fmt.Sprintf("Range %q: allowed %v hours.", h, whatifRanges))
		}
		pg.Hours = n
	}
	if !s.whatifBusy.TryLock() {
		return &userError{Status: http.StatusTooManyRequests, Msg: "Refused: a what-if or the advisor is running on this console; try again when it ends."}
	}
	defer s.whatifBusy.Unlock()
	ctx, cancel := context.WithTimeout(r.Context(), whatifTimeout)
	defer cancel()
	until := time.Now()
	res, err := advise.Run(ctx, s.cfg.Kafka, s.cfg.Topics.Topics(),
		advise.Options{Policy: s.cfg.Policy},
		advise.RunOptions{Since: until.Add(-time.Duration(pg.Hours) * time.Hour), Until: until, RunningFile: s.cfg.PolicyFile, Idle: 20 * time.Second})
	if err != nil {
		return &userError{Status: http.StatusServiceUnavailable, Msg: "The advisor could not read the topics: " + err.Error()}
	}
	s.log.Info("console: advise", "user", p.Name, "hours", pg.Hours, "decisions", res.Inputs, "proposals", len(res.Proposals))
	pg.Report, pg.Candidate, pg.Whatif, pg.WhatifErr = res.Report, string(res.Candidate), res.Whatif, res.WhatifError
	for _, pr := range res.Proposals {
		pg.Proposals = append(pg.Proposals, proposalView{Proposal: pr, Plot: plotOf(&pr)})
	}
	if x := pg.Whatif; x != nil {
		top := 0
		for _, o := range x.Review {
			top = max(top, o.Baseline, o.Candidate)
		}
		for _, o := range x.Review {
			pg.Owners = append(pg.Owners, pairOf(o.Owner, o.Baseline, o.Candidate, top))
		}
		removed, added := ledger.Micros(x.Cost.RemovedUSD), ledger.Micros(x.Cost.AddedUSD)
		mx := max(removed, added, 1)
		pg.Cost = []pairBar{
			{Label: fmt.Sprintf("%d attempts it stops (observed)", x.Cost.RemovedAttempts), Baseline: dollars(removed), BW: int(removed * 300 / mx)},
			{Label: fmt.Sprintf("%d attempts it adds (estimated)", x.Cost.AddedAttempts), Candidate: dollars(added), CW: int(added * 300 / mx)},
		}
	}
	s.render(w, r, p, "advise", http.StatusOK, "Advise", "advise", pg)
	return nil
}

// plotOf draws a proposal's evidence.
func plotOf(p *advise.Proposal) plot {
	switch p.Kind {
	case advise.KindMaxRetries:
		pl := plot{Caption: fmt.Sprintf("success of the next attempt by retry number, %s, %s (bars: rate; lines: 95%% interval)", p.Class, p.Match)}
		for _, row := range p.Retries {
			cls := "keep"
			if float64(row.N) > p.Change.To {
				cls = "drop"
			}
			pl.bar(fmt.Sprintf("retry %d", row.N), fmt.Sprintf("retry %d: %d of %d succeeded", row.N, row.Success.K, row.Success.N), cls,
				row.Success.Rate, row.Success.Interval, len(p.Retries))
		}
		return pl.done()
	case advise.KindMinConfidence:
		pl := plot{Caption: fmt.Sprintf("reviewers' approvals by confidence band, %s (bars: rate; lines: 95%% interval)", p.Match)}
		for _, b := range p.Bands {
			cls := "keep"
			if b.From >= p.Change.To {
				cls = "drop"
			}
			pl.bar(strconv.FormatFloat(b.From, 'f', 2, 64), fmt.Sprintf("%.2f-%.2f: %d of %d approved", b.From, b.To, b.Approved.K, b.Approved.N), cls,
				b.Approved.Rate, b.Approved.Interval, len(p.Bands))
		}
		return pl.done()
	case advise.KindOwnerSLA:
		pl := plot{Caption: fmt.Sprintf("how long %s's items waited (bars: items per %s; marks: the SLA now and proposed)", p.Owner, time.Duration(p.BucketMs)*time.Millisecond)}
		top := 1
		for _, n := range p.Hist {
			top = max(top, n)
		}
		n := len(p.Hist)
		for i, c := range p.Hist {
			from := time.Duration(int64(i)*p.BucketMs) * time.Millisecond
			pl.bar(from.String(), fmt.Sprintf("%s-%s: %d items", from, from+time.Duration(p.BucketMs)*time.Millisecond, c), "keep", float64(c)/float64(top), advise.Interval{}, n)
			b := &pl.Bars[len(pl.Bars)-1]
			b.Whisker = false
			if i%max(1, (n+5)/6) != 0 { // a label every few buckets: they would overlap
				b.Label = ""
			}
		}
		span := float64(n) * float64(p.BucketMs)
		at := func(ms float64) int { return 40 + int(math.Round(ms/span*float64(plotW-50))) }
		pl.Marks = []plotMark{
			{X: at(p.Change.From), Label: "SLA " + (time.Duration(p.Change.From) * time.Millisecond).String(), Class: "now"},
			{X: at(p.Change.To), Label: "proposed " + (time.Duration(p.Change.To) * time.Millisecond).String(), Class: "prop"},
		}
		return pl.done()
	}
	return plot{}
}

// bar adds bar i of n: a rate (0..1) and its interval.
func (pl *plot) bar(label, title, class string, rate float64, iv advise.Interval, n int) {
	slot := (plotW - 50) / max(n, 1)
	i := len(pl.Bars)
	y := func(v float64) int { return plotBase - int(math.Round(v*float64(plotBase-plotTop))) }
	b := plotBar{X: 40 + i*slot + slot/6, W: max(slot*2/3, 2), Label: label, Title: title, Class: class, Whisker: true}
	b.Y = y(rate)
	b.H = plotBase - b.Y
	b.WX = b.X + b.W/2
	b.WY1, b.WY2 = y(iv.Lo), y(iv.Hi)
	pl.Bars = append(pl.Bars, b)
}

func (pl plot) done() plot {
	pl.W, pl.H = plotW, plotH
	return pl
}
