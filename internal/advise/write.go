package advise

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/faultrouter/faultrouter/internal/ledger"
	"github.com/faultrouter/faultrouter/internal/whatif"
)

// resultJSON is the JSON form of a Result.
type resultJSON struct {
	Since string `json:"since"`
	Until string `json:"until"`
	*Report
	Candidate     string         `json:"candidate"`
	CandidateFile string         `json:"candidate_file,omitempty"`
	Whatif        *whatif.Report `json:"whatif"`
	WhatifError   string         `json:"whatif_error,omitempty"`
}

// WriteJSON writes the result as one indented JSON object; file is where
// the candidate was written ("" when it was not).
func (r *Result) WriteJSON(w io.Writer, file string) error {
	if r.Proposals == nil {
		r.Proposals = []Proposal{}
	}
	b, err := json.MarshalIndent(resultJSON{Since: stamp(r.Since), Until: stamp(r.Until), Report: r.Report,
		Candidate: string(r.Candidate), CandidateFile: file, Whatif: r.Whatif, WhatifError: r.WhatifError}, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// WriteTable prints the result for a person: the proposals with their
// evidence, the candidate (its file, or its text when file is ""), the
// candidate's what-if, then the measurements.
func (r *Result) WriteTable(w io.Writer, file string) error {
	fmt.Fprintf(w, "range: %s to %s\n", r.Since.UTC().Format(time.RFC3339), r.Until.UTC().Format(time.RFC3339))
	fmt.Fprintf(w, "read: %d decisions of %d tasks; a proposal rests on at least %d observations\n\n", r.Inputs, r.Tasks, r.MinCount)
	if len(r.Proposals) == 0 {
		fmt.Fprintf(w, "proposals: none (nothing in the range shows a pattern that %d or more observations support)\n", r.MinCount)
	} else {
		fmt.Fprintf(w, "proposals: %d\n", len(r.Proposals))
	}
	for i, p := range r.Proposals {
		fmt.Fprintf(w, "  %d. %s\n", i+1, p.Change.Text)
		if p.Match != nil {
			fmt.Fprintf(w, "     override %s\n", p.Name)
		}
		fmt.Fprintf(w, "     evidence: %s\n", p.Evidence.Text)
	}
	if r.Candidate != nil {
		if file != "" {
			fmt.Fprintf(w, "\ncandidate policy written to %s (check it: faultrouter policy check %s)\n", file, file)
		} else {
			fmt.Fprintf(w, "\ncandidate policy (--out FILE writes it to a file):\n")
			for _, l := range strings.Split(strings.TrimRight(string(r.Candidate), "\n"), "\n") {
				fmt.Fprintf(w, "  | %s\n", l)
			}
		}
	}
	switch {
	case r.Whatif != nil:
		r.writeWhatif(w, file)
	case r.WhatifError != "":
		fmt.Fprintf(w, "\nwhat-if of the candidate: not run: %s\n", r.WhatifError)
	}
	r.writeMeasures(w)
	return nil
}

// writeWhatif prints the what-if's summary: attempts, cost, review items
// per owner.
func (r *Result) writeWhatif(w io.Writer, file string) {
	x := r.Whatif
	fmt.Fprintf(w, "\nwhat-if of the candidate against the running policy:\n")
	fmt.Fprintf(w, "  disagreements: %d (the running policy replayed vs the audit)\n", x.Disagreements)
	fmt.Fprintf(w, "  changed:       %d decisions of %d tasks\n", x.Changed, x.ChangedTasks)
	fmt.Fprintf(w, "  retries:       %d -> %d\n", x.Retries.Baseline, x.Retries.Candidate)
	c := x.Cost
	fmt.Fprintf(w, "  attempts:      %d fewer (%s, observed), %d more (%s, estimated)\n", c.RemovedAttempts, ledger.Dollars(c.RemovedUSD), c.AddedAttempts, ledger.Dollars(c.AddedUSD))
	sign := "+"
	if c.NetUSD < 0 {
		sign = "-"
	}
	fmt.Fprintf(w, "  net cost:      %s%s\n", sign, ledger.Dollars(max(c.NetUSD, -c.NetUSD)))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  REVIEW ITEMS PER OWNER\tRUNNING\tCANDIDATE\t")
	for _, o := range x.Review {
		fmt.Fprintf(tw, "  %s\t%d\t%d\t\n", o.Owner, o.Baseline, o.Candidate)
	}
	tw.Flush()
	if file == "" {
		file = "CANDIDATE.yaml"
	}
	fmt.Fprintf(w, "  the whole what-if: faultrouter policy whatif --policy %s --since %s --until %s\n", file, stamp(r.Since), stamp(r.Until))
}

func (r *Result) writeMeasures(w io.Writer) {
	fmt.Fprintf(w, "\nsuccess by retry number (the attempt after retry N of the class):\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  CLASS\tPROVIDER/MODEL\tRETRY\tNEXT ATTEMPTS\tSUCCEEDED\t95% INTERVAL\tMEAN COST\tMEAN DELAY\t")
	for _, x := range r.Retries {
		fmt.Fprintf(tw, "  %s\t%s/%s\t%d\t%d\t%s\t%s\t%s\t%s\t\n", x.Class, x.Match.Provider, x.Match.Model, x.N, x.Success.N,
			pct(x.Success.Rate), pcts(x.Success.Interval), ledger.Dollars(x.MeanCostUSD), dur(x.MeanDelayMs))
	}
	tw.Flush()
	fmt.Fprintf(w, "\nreviewers' approvals by confidence band (output.confidence of the attempt that opened the item):\n")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  OWNER\tCLASS\tCONFIDENCE\tDECIDED\tAPPROVED\t95% INTERVAL\t")
	for _, x := range r.Approvals {
		band := "none"
		if x.From >= 0 {
			band = strconv.FormatFloat(x.From, 'f', 2, 64) + "-" + strconv.FormatFloat(x.To, 'f', 2, 64)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\t%s\t\n", x.Owner, x.Class, band, x.Approved.N, pct(x.Approved.Rate), pcts(x.Approved.Interval))
	}
	tw.Flush()
	fmt.Fprintf(w, "\nreview waits (from the attempt's occurred_at to the reviewer's decision):\n")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  OWNER\tCLASS\tSLA\tANSWERED\tMEDIAN\t95% INTERVAL\tP90\tWITHIN SLA\tUNANSWERED\t")
	for _, x := range r.Waits {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\t%s-%s\t%s\t%s\t%d\t\n", x.Owner, x.Class, dur(x.SLAMs), x.N, dur(x.MedianMs),
			dur(x.MedianLoMs), dur(x.MedianHiMs), dur(x.P90Ms), pct(x.WithinSLA.Rate), x.Unanswered)
	}
	tw.Flush()
}
