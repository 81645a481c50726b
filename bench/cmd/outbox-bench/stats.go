package main

import (
	"math"
	"slices"
	"time"
)

// Percentile returns the p-th percentile (0 ≤ p ≤ 100) of sorted by the
// nearest-rank method: the smallest sample such that at least p% of the samples
// are ≤ it. Nearest rank never interpolates, so every reported latency is one
// that an event really had. It returns 0 for no samples.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	if p <= 0 {
		return sorted[0]
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// Median returns the median of xs (mean of the two middle values for an even
// count) without reordering xs, and 0 for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Latency summarises one latency distribution.
type Latency struct {
	Count int           `json:"count"`
	P50   time.Duration `json:"p50_ns"`
	P95   time.Duration `json:"p95_ns"`
	P99   time.Duration `json:"p99_ns"`
	Max   time.Duration `json:"max_ns"`
}

// Summarize sorts samples in place and returns their percentiles.
func Summarize(samples []time.Duration) Latency {
	slices.Sort(samples)
	l := Latency{Count: len(samples)}
	if len(samples) == 0 {
		return l
	}
	l.P50 = Percentile(samples, 50)
	l.P95 = Percentile(samples, 95)
	l.P99 = Percentile(samples, 99)
	l.Max = samples[len(samples)-1]
	return l
}

// MedianLatency takes the median of each percentile over runs: the median run
// is what a reader should expect, one noisy run on a shared machine is not.
func MedianLatency(runs []Latency) Latency {
	if len(runs) == 0 {
		return Latency{}
	}
	pick := func(f func(Latency) time.Duration) time.Duration {
		xs := make([]float64, len(runs))
		for i, r := range runs {
			xs[i] = float64(f(r))
		}
		return time.Duration(Median(xs))
	}
	var count int
	for _, r := range runs {
		count += r.Count
	}
	return Latency{
		Count: count,
		P50:   pick(func(l Latency) time.Duration { return l.P50 }),
		P95:   pick(func(l Latency) time.Duration { return l.P95 }),
		P99:   pick(func(l Latency) time.Duration { return l.P99 }),
		Max:   pick(func(l Latency) time.Duration { return l.Max }),
	}
}

// Spread is how far the runs of a workload lay apart: for each percentile,
// the lowest (Min) and highest (Max) of the runs' figures. A median of three
// says nothing of whether the three agreed; the report gives both.
type Spread struct {
	Min Latency `json:"min"`
	Max Latency `json:"max"`
}

// SpreadOf is the per-percentile minimum and maximum over runs.
func SpreadOf(runs []Latency) Spread {
	var s Spread
	for i, r := range runs {
		if i == 0 {
			s.Min, s.Max = r, r
			continue
		}
		s.Min.P50, s.Max.P50 = min(s.Min.P50, r.P50), max(s.Max.P50, r.P50)
		s.Min.P95, s.Max.P95 = min(s.Min.P95, r.P95), max(s.Max.P95, r.P95)
		s.Min.P99, s.Max.P99 = min(s.Min.P99, r.P99), max(s.Max.P99, r.P99)
		s.Min.Max, s.Max.Max = min(s.Min.Max, r.Max), max(s.Max.Max, r.Max)
		s.Min.Count, s.Max.Count = min(s.Min.Count, r.Count), max(s.Max.Count, r.Count)
	}
	return s
}

// Histogram counts latencies in logarithmic buckets: BucketsPerDecade buckets
// per power of ten from Min up; samples below Min land in the first bucket and
// samples at or above the last edge in the last.
type Histogram struct {
	Min              time.Duration `json:"min_ns"`
	BucketsPerDecade int           `json:"buckets_per_decade"`
	Counts           []int         `json:"counts"`
}

// NewHistogram returns a histogram covering [lo, hi) with perDecade buckets
// per power of ten.
func NewHistogram(lo, hi time.Duration, perDecade int) *Histogram {
	n := int(math.Ceil(math.Log10(float64(hi)/float64(lo)) * float64(perDecade)))
	return &Histogram{Min: lo, BucketsPerDecade: perDecade, Counts: make([]int, max(n, 1))}
}

// Add counts one sample.
func (h *Histogram) Add(d time.Duration) {
	i := 0
	if d > h.Min {
		i = int(math.Floor(math.Log10(float64(d)/float64(h.Min)) * float64(h.BucketsPerDecade)))
	}
	h.Counts[min(max(i, 0), len(h.Counts)-1)]++
}

// Edge returns the lower bound of bucket i (Edge(len(Counts)) is the upper
// bound of the last bucket).
func (h *Histogram) Edge(i int) time.Duration {
	return time.Duration(float64(h.Min) * math.Pow(10, float64(i)/float64(h.BucketsPerDecade)))
}
