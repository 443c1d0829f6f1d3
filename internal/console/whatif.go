package console

// whatif.go: the What-if page. An operator pastes or uploads a candidate
// policy file and picks a range; the console replays the committed task
// events and review decisions of the range through the policy it runs with
// (--policy, the router's file) and the candidate (internal/whatif, the code
// of `faultrouter policy whatif`) and shows the self-check first, then the transition
// matrix, routes, review load per owner and the cost impact as SVG bars,
// and the changed decisions with links to their timelines.
//
// A what-if reads up to a week of three topics: only operators run it, one
// at a time per console, within a time limit; the policy pasted is parsed
// and validated like a policy file and never stored.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/faultrouter/faultrouter/internal/ledger"
	"github.com/faultrouter/faultrouter/internal/whatif"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// whatifRanges are the ranges the page offers, in hours.
var whatifRanges = []int{1, 6, 24, 168}

const (
	maxCandidateBytes = 256 << 10
	whatifTimeout     = 2 * time.Minute
)

// whatifPage is the data of the What-if page.
type whatifPage struct {
	Policy  string
	Hours   int
	Ranges  []int
	Report  *whatif.Report
	Owners  []pairBar
	Routes  []pairBar
	Cost    []pairBar
	Changes []whatif.Change
	More    int
}

// candidateText is the candidate policy of a what-if: the file uploaded
// (policy_file), if one was chosen, else the text pasted (policy). A file
// is read up to one byte past maxCandidateBytes, so that an oversized one is
// refused by its size.
func candidateText(r *http.Request) (string, error) {
	f, _, err := r.FormFile("policy_file")
	switch {
	case errors.Is(err, http.ErrMissingFile), errors.Is(err, http.ErrNotMultipart):
		return r.PostFormValue("policy"), nil
	case err != nil:
		return "", badRequest("The uploaded policy file could not be read: " + err.Error())
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCandidateBytes+1))
	if err != nil {
		return "", badRequest("The uploaded policy file could not be read: " + err.Error())
	}
	if len(b) == 0 { // a file input left empty sends an empty part
		return r.PostFormValue("policy"), nil
	}
	return string(b), nil
}

// pairBar is one row of a chart comparing the baseline and the candidate.
type pairBar struct {
	Label               string
	Baseline, Candidate string
	BW, CW              int // bar widths, of 300
}

func (s *Server) whatifForm(w http.ResponseWriter, r *http.Request, p *person) error {
	s.render(w, r, p, "whatif", http.StatusOK, "What-if", "whatif", whatifPage{Hours: 24, Ranges: whatifRanges})
	return nil
}

func (s *Server) whatifRun(w http.ResponseWriter, r *http.Request, p *person) error {
	if err := needOperator(p, "running a what-if"); err != nil {
		return err
	}
	text, err := candidateText(r)
	if err != nil {
		return err
	}
	pg := whatifPage{Policy: text, Hours: 24, Ranges: whatifRanges}
	if h := r.PostFormValue("hours"); h != "" {
		n, err := strconv.Atoi(h)
		if err != nil || !slices.Contains(whatifRanges, n) {
			return badRequest(fmt.Sprintf("Range %q: allowed %v hours.", h, whatifRanges))
		}
		pg.Hours = n
	}
	switch {
	case len(text) > maxCandidateBytes:
		return badRequest(fmt.Sprintf("The candidate policy is %d bytes; at most %d.", len(text), maxCandidateBytes))
	case len(text) == 0:
		return badRequest("Paste or upload the candidate policy file (YAML) first.")
	}
	cand, err := policy.Parse([]byte(text))
	if err != nil {
		return badRequest("The candidate policy: " + err.Error())
	}
	if !s.whatifBusy.TryLock() {
		return &userError{Status: http.StatusTooManyRequests, Msg: "Refused: another what-if is running on this console; try again when it ends."}
	}
	defer s.whatifBusy.Unlock()
	if err := s.record(r.Context(), opAction{Action: "whatif", User: p.Name,
		What: fmt.Sprintf("what-if of a candidate policy (%d bytes, sha256 %s) over the last %dh", len(text), digest([]string{text})[:12], pg.Hours)}); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.Context(), whatifTimeout)
	defer cancel()
	until := time.Now()
	rep, err := whatif.Run(ctx, s.cfg.Kafka, s.cfg.Topics.Topics(),
		whatif.Options{Baseline: s.cfg.Policy, Candidate: cand, Since: until.Add(-time.Duration(pg.Hours) * time.Hour), Until: until},
		whatif.RunOptions{Idle: 20 * time.Second})
	if err != nil {
		return &userError{Status: http.StatusServiceUnavailable, Msg: "The what-if could not read the topics: " + err.Error()}
	}
	s.log.Info("console: what-if", "user", p.Name, "hours", pg.Hours, "decisions", rep.Decisions, "changed", rep.Changed, "disagreements", rep.Disagreements)
	pg.Report = rep
	pg.fill()
	s.render(w, r, p, "whatif", http.StatusOK, "What-if", "whatif", pg)
	return nil
}

// fill lays out the charts and the list of changes.
func (pg *whatifPage) fill() {
	r := pg.Report
	var top int
	for _, o := range r.Review {
		top = max(top, o.Baseline, o.Candidate)
	}
	for _, o := range r.Review {
		pg.Owners = append(pg.Owners, pairOf(o.Owner, o.Baseline, o.Candidate, top))
	}
	top = 0
	for _, x := range r.Routes {
		top = max(top, x.Baseline, x.Candidate)
	}
	for _, x := range r.Routes {
		pg.Routes = append(pg.Routes, pairOf(string(x.Route), x.Baseline, x.Candidate, top))
	}
	removed, added := ledger.Micros(r.Cost.RemovedUSD), ledger.Micros(r.Cost.AddedUSD)
	mx := max(removed, added, 1)
	pg.Cost = []pairBar{
		{Label: "attempts it stops (observed)", Baseline: dollars(removed), BW: int(removed * 300 / mx)},
		{Label: "attempts it adds (estimated)", Candidate: dollars(added), CW: int(added * 300 / mx)},
	}
	pg.Changes = r.Changes
	if len(pg.Changes) > 200 {
		pg.Changes, pg.More = pg.Changes[:200], len(r.Changes)-200
	}
}

func pairOf(label string, b, c, top int) pairBar {
	top = max(top, 1)
	return pairBar{Label: label, Baseline: strconv.Itoa(b), Candidate: strconv.Itoa(c), BW: b * 300 / top, CW: c * 300 / top}
}
