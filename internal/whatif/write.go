package whatif

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/faultrouter/faultrouter/internal/ledger"
)

// WriteJSON writes the report as one indented JSON object.
func (r *Report) WriteJSON(w io.Writer) error {
	type alias Report
	b, err := json.MarshalIndent(struct {
		Since string `json:"since,omitempty"`
		Until string `json:"until,omitempty"`
		*alias
	}{r.Since, r.Until, (*alias)(r)}, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// WriteCSV writes the changed decisions, one a line, with a header.
func (r *Report) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"task_id", "input", "decided_at", "baseline_class", "baseline_route", "baseline_rule",
		"candidate_class", "candidate_route", "candidate_rule"})
	for _, c := range r.Changes {
		cw.Write([]string{c.Task, c.Input, c.DecidedAt.UTC().Format(time.RFC3339Nano), string(c.BaselineClass),
			string(c.BaselineRoute), c.BaselineRule, string(c.CandidateClass), string(c.CandidateRoute), c.CandidateRule})
	}
	cw.Flush()
	return cw.Error()
}

// WriteTable prints the report for a person, the self-check first.
func (r *Report) WriteTable(w io.Writer) error {
	if r.Since != "" {
		fmt.Fprintf(w, "range: %s to %s\n", r.Since, r.Until)
	}
	fmt.Fprintf(w, "disagreements: %d (the baseline replayed vs the decisions the router recorded)\n", r.Disagreements)
	if r.Disagreements > 0 {
		fmt.Fprintf(w, "  the what-if cannot be trusted for %d task(s):\n", r.DisagreementTasks)
		for _, why := range []string{WhyRangeStart, WhyExpiry, WhyPolicy, WhyNoAudit} {
			if n := r.Why[why]; n > 0 {
				fmt.Fprintf(w, "  %d decision(s): %s\n", n, whyText(why))
			}
		}
		for _, d := range r.DisagreementList {
			fmt.Fprintf(w, "  task %s input %s: %s\n", d.Task, d.Input, d.Detail)
		}
	}
	fmt.Fprintf(w, "replayed: %d decisions of %d tasks\n", r.Decisions, r.Tasks)
	fmt.Fprintf(w, "changed: %d decisions of %d tasks\n\n", r.Changed, r.ChangedTasks)

	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLASS\tBASELINE\t\tCANDIDATE\tCOUNT\tEXAMPLES\t")
	for _, c := range r.Matrix {
		to := string(c.To)
		if c.ToClass != c.Class {
			to = string(c.ToClass) + " " + to
		}
		mark := "  "
		if c.Changed {
			mark = "->"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t\n", c.Class, c.From, mark, to, c.Count, strings.Join(c.Examples, " "))
	}
	tw.Flush()

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ROUTE\tBASELINE\tCANDIDATE\tDELTA\t")
	for _, x := range r.Routes {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%+d\t\n", x.Route, x.Baseline, x.Candidate, x.Candidate-x.Baseline)
	}
	tw.Flush()
	fmt.Fprintf(w, "retries: baseline %d, candidate %d (%d added, %d removed)\n\n", r.Retries.Baseline, r.Retries.Candidate, r.Retries.Added, r.Retries.Removed)

	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REVIEW OWNER\tSLA\tBASELINE\tCANDIDATE\tBASELINE/DAY\tCANDIDATE/DAY\tWITHIN SLA (BASELINE, CANDIDATE)\tUNANSWERED\t")
	for _, x := range r.Review {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%d, %d\t%d, %d\t\n", x.Owner, time.Duration(x.SLAMs)*time.Millisecond, x.Baseline, x.Candidate,
			strconv.FormatFloat(x.BaselinePerDay, 'f', 1, 64), strconv.FormatFloat(x.CandidatePerDay, 'f', 1, 64),
			x.BaselineWithinSLA, x.CandidateWithinSLA, x.BaselineUnanswered, x.CandidateUnanswered)
	}
	tw.Flush()

	if len(r.Breakers) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "BREAKER OPENINGS (estimated)\tBASELINE\tCANDIDATE\t")
		for _, x := range r.Breakers {
			fmt.Fprintf(tw, "%s\t%d\t%d\t\n", x.Breaker, x.Baseline, x.Candidate)
		}
		tw.Flush()
	}

	c := r.Cost
	fmt.Fprintf(w, "\ncost of the attempts replayed: %s (observed)\n", ledger.Dollars(c.ObservedUSD))
	fmt.Fprintf(w, "attempts the candidate stops:  %d, %s (observed: they happened after a retry it drops)\n", c.RemovedAttempts, ledger.Dollars(c.RemovedUSD))
	fmt.Fprintf(w, "attempts the candidate adds:   %d, %s (estimated: the observed mean attempt cost of their class and provider/model)\n", c.AddedAttempts, ledger.Dollars(c.AddedUSD))
	sign := "+"
	if c.NetUSD < 0 {
		sign = "-"
	}
	fmt.Fprintf(w, "net:                           %s%s\n", sign, ledger.Dollars(abs(c.NetUSD)))
	first := true
	for _, c := range r.Matrix {
		if !c.Changed || len(c.Examples) == 0 {
			continue
		}
		if first {
			fmt.Fprintln(w, "\nthe story of a changed task, per changed cell (* the candidate decides differently):")
			first = false
		}
		task := c.Examples[0]
		fmt.Fprintf(w, "  %s %s -> %s %s: task %s (its records: faultrouter replay --task %s --timeline)\n", c.Class, c.From, c.ToClass, c.To, task, task)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, st := range r.Timelines[task] {
			mark := " "
			if st.Changed {
				mark = "*"
			}
			fmt.Fprintf(tw, "    %s\t%s\t%s %s %s\t%s\t%s %s %s\t\n", st.DecidedAt.UTC().Format(time.RFC3339), st.Input,
				st.BaselineClass, st.BaselineRoute, st.BaselineRule, mark, st.CandidateClass, st.CandidateRoute, st.CandidateRule)
		}
		tw.Flush()
	}
	fmt.Fprintln(w, "\nlimits of a what-if (decisions of the range each could touch):")
	for _, l := range r.Limits {
		fmt.Fprintf(w, "  - %d: %s\n", l.Decisions, l.Text)
	}
	return nil
}

func abs(v float64) float64 {
	if v < 0 {
		return -v
	}
	return v
}

func whyText(why string) string {
	switch why {
	case WhyRangeStart:
		return "the range starts inside the task's life (the router had seen attempts before --since); start the range earlier"
	case WhyPolicy:
		return "the baseline decides otherwise than the policy that ran; is --baseline the file the router ran with?"
	case WhyExpiry:
		return "the router decided on a fresh state (the task's state had expired) and the replay on the one it carried, or the other way round; are the retry topic and the task's earlier inputs in the logs read?"
	case WhyNoAudit:
		return "an input has no audit record in the logs read (decided after they were read?)"
	}
	return why
}
