package ledger

import (
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"
)

// WriteTable prints the report for a person: the totals, then spend by
// class, provider/model, prompt template and review owner (provider/model
// and template at most top rows each, the rest summed in one line; top <= 0
// prints every row), and the cost prevented by stop.
func (r *Report) WriteTable(w io.Writer, top int) error {
	fmt.Fprintf(w, "spend %s: failed %s, succeeded %s (%d attempts, %d tokens, %s)\n",
		Dollars(r.TotalUSD), Dollars(r.FailedUSD), Dollars(r.SucceededUSD), r.Attempts, r.Tokens,
		(time.Duration(r.ElapsedMs) * time.Millisecond).String())
	fmt.Fprintf(w, "cost prevented %s (against a baseline that retries every failure %d times)\n",
		Dollars(r.PreventedUSD), r.BaselineRetries)
	for _, s := range []struct {
		title string
		rows  []Row
		cut   bool
	}{{"CLASS", r.Classes, false}, {"PROVIDER/MODEL", r.Models, true}, {"PROMPT TEMPLATE", r.Templates, true}, {"REVIEW OWNER", r.Owners, false}} {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "%s\tATTEMPTS\tFAILED\tSPEND\tFAILED SPEND\tSUCCEEDED SPEND\tTOKENS\tPREVENTED\t\n", s.title)
		rows := s.rows
		var rest Row
		if s.cut && top > 0 && len(rows) > top {
			for _, x := range rows[top:] {
				rest = plus(rest, x)
			}
			rest.Key = fmt.Sprintf("(%d more)", len(rows)-top)
			rows = append(rows[:top:top], rest)
		}
		for _, x := range rows {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%d\t%s\t\n", x.Key, x.Attempts, x.Failed, Dollars(x.CostUSD),
				Dollars(x.FailedUSD), Dollars(x.SucceededUSD), x.Tokens, Dollars(x.PreventedUSD))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "STOP\tTASKS STOPPED\tBASELINE ATTEMPTS AVOIDED\tPREVENTED\t\n")
	for _, x := range r.Prevented {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t\n", x.Key, x.Stops, x.PreventedAttempts, Dollars(x.PreventedUSD))
	}
	return tw.Flush()
}

func plus(a, b Row) Row {
	a.Attempts += b.Attempts
	a.Failed += b.Failed
	a.CostUSD = usd(Micros(a.CostUSD) + Micros(b.CostUSD))
	a.FailedUSD = usd(Micros(a.FailedUSD) + Micros(b.FailedUSD))
	a.SucceededUSD = usd(Micros(a.SucceededUSD) + Micros(b.SucceededUSD))
	a.Tokens += b.Tokens
	a.ElapsedMs += b.ElapsedMs
	a.Stops += b.Stops
	a.PreventedAttempts += b.PreventedAttempts
	a.PreventedUSD = usd(Micros(a.PreventedUSD) + Micros(b.PreventedUSD))
	return a
}

// Dollars formats an amount as $1.234567 without trailing zeros, at least
// two decimals: $0.50, $237.01, $0.000412.
func Dollars(v float64) string {
	s := strconv.FormatFloat(usd(Micros(v)), 'f', -1, 64)
	dot := -1
	for i := range s {
		if s[i] == '.' {
			dot = i
		}
	}
	switch {
	case dot < 0:
		s += ".00"
	case len(s)-dot == 2:
		s += "0"
	}
	return "$" + s
}
