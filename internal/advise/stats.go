package advise

import (
	"math"
	"slices"
	"time"
)

// z is the normal quantile of the 95% intervals every proposal states.
const z = 1.959964

// Interval is a 95% confidence interval.
type Interval struct {
	Lo float64 `json:"lo"`
	Hi float64 `json:"hi"`
}

// Holds reports whether v lies in the interval.
func (i Interval) Holds(v float64) bool { return i.Lo <= v && v <= i.Hi }

// wilson is the Wilson score interval of k successes in n trials: unlike
// k/n ± z·se it stays inside [0, 1] and is honest at 0 of n, the case a
// retry that never helps produces.
func wilson(k, n int) Interval {
	if n == 0 {
		return Interval{0, 1}
	}
	p, nf := float64(k)/float64(n), float64(n)
	d := 1 + z*z/nf
	c := (p + z*z/(2*nf)) / d
	h := z * math.Sqrt(p*(1-p)/nf+z*z/(4*nf*nf)) / d
	return Interval{Lo: round4(max(0, c-h)), Hi: round4(min(1, c+h))}
}

func round4(v float64) float64 { return math.Round(v*1e4) / 1e4 }

// Rate is k of n with its Wilson interval.
type Rate struct {
	N        int      `json:"n"`
	K        int      `json:"k"`
	Rate     float64  `json:"rate"`
	Interval Interval `json:"interval"`
}

func rateOf(k, n int) Rate {
	r := Rate{N: n, K: k, Interval: wilson(k, n)}
	if n > 0 {
		r.Rate = round4(float64(k) / float64(n))
	}
	return r
}

// Waits summarises the waits of answered review items: the median with a
// distribution-free 95% interval (order statistics of the binomial), the
// 90th percentile, and how many were answered within an SLA.
type Waits struct {
	N        int   `json:"answered"`
	MedianMs int64 `json:"median_ms"`
	// MedianInterval is the 95% interval of the median, in milliseconds.
	MedianLoMs int64 `json:"median_lo_ms"`
	MedianHiMs int64 `json:"median_hi_ms"`
	P90Ms      int64 `json:"p90_ms"`
	// WithinSLA is the share answered within the owner's SLA.
	WithinSLA Rate `json:"within_sla"`
}

// summarise summarises waits (milliseconds, any order) against sla.
func summarise(waits []int64, slaMs int64) Waits {
	w := slices.Clone(waits)
	slices.Sort(w)
	n := len(w)
	s := Waits{N: n}
	if n == 0 {
		return s
	}
	within := 0
	for _, v := range w {
		if v <= slaMs {
			within++
		}
	}
	s.WithinSLA = rateOf(within, n)
	s.MedianMs = quantile(w, 0.5)
	s.P90Ms = quantile(w, 0.9)
	// ranks (1-based) j < k with P(j <= rank of the median <= k) >= 95%
	h := z * math.Sqrt(float64(n)) / 2
	lo := max(1, int(math.Floor(float64(n)/2-h)))
	hi := min(n, int(math.Ceil(float64(n)/2+1+h)))
	s.MedianLoMs, s.MedianHiMs = w[lo-1], w[hi-1]
	return s
}

// quantile is the q-quantile of sorted w, the nearest rank.
func quantile(w []int64, q float64) int64 {
	i := int(math.Ceil(q*float64(len(w)))) - 1
	return w[min(max(i, 0), len(w)-1)]
}

// ceilMinute rounds a duration in milliseconds up to a whole minute.
func ceilMinute(ms int64) int64 {
	m := int64(time.Minute / time.Millisecond)
	return (ms + m - 1) / m * m
}
