package main

import (
	"testing"
	"time"
)

func ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

func TestPercentile(t *testing.T) {
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = ms(float64(i + 1)) // 1ms … 100ms
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"single", []time.Duration{ms(7)}, 99, ms(7)},
		{"p0 is min", hundred, 0, ms(1)},
		{"p50 of 100", hundred, 50, ms(50)},
		{"p95 of 100", hundred, 95, ms(95)},
		{"p99 of 100", hundred, 99, ms(99)},
		{"p100 is max", hundred, 100, ms(100)},
		{"nearest rank rounds up", []time.Duration{ms(1), ms(2), ms(3)}, 50, ms(2)},
		{"p99 of 3 is max", []time.Duration{ms(1), ms(2), ms(3)}, 99, ms(3)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percentile(tt.sorted, tt.p); got != tt.want {
				t.Errorf("Percentile(%d samples, %v) = %v; want %v", len(tt.sorted), tt.p, got, tt.want)
			}
		})
	}
}

func TestMedian(t *testing.T) {
	tests := []struct {
		xs   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{100, 1, 1}, 1},
	}
	for _, tt := range tests {
		in := append([]float64(nil), tt.xs...)
		if got := Median(tt.xs); got != tt.want {
			t.Errorf("Median(%v) = %v; want %v", tt.xs, got, tt.want)
		}
		for i := range in {
			if in[i] != tt.xs[i] {
				t.Errorf("Median(%v) reordered its input to %v", in, tt.xs)
				break
			}
		}
	}
}

func TestSummarize(t *testing.T) {
	var samples []time.Duration
	for i := 1000; i >= 1; i-- { // unsorted on purpose
		samples = append(samples, ms(float64(i)/10))
	}
	got := Summarize(samples)
	want := Latency{Count: 1000, P50: ms(50), P95: ms(95), P99: ms(99), Max: ms(100)}
	if got != want {
		t.Errorf("Summarize(0.1ms…100ms) = %+v; want %+v", got, want)
	}
	if got := Summarize(nil); got != (Latency{}) {
		t.Errorf("Summarize(nil) = %+v; want zero", got)
	}
}

func TestMedianLatency(t *testing.T) {
	runs := []Latency{
		{Count: 10, P50: ms(1), P95: ms(5), P99: ms(9), Max: ms(100)},
		{Count: 10, P50: ms(2), P95: ms(6), P99: ms(50), Max: ms(20)},
		{Count: 10, P50: ms(3), P95: ms(4), P99: ms(10), Max: ms(30)},
	}
	want := Latency{Count: 30, P50: ms(2), P95: ms(5), P99: ms(10), Max: ms(30)}
	if got := MedianLatency(runs); got != want {
		t.Errorf("MedianLatency(...) = %+v; want %+v", got, want)
	}
}

func TestHistogram(t *testing.T) {
	h := NewHistogram(100*time.Microsecond, 100*time.Second, 10)
	if got, want := len(h.Counts), 60; got != want {
		t.Fatalf("len(NewHistogram(100µs, 100s, 10).Counts) = %d; want %d", got, want)
	}
	tests := []struct {
		d      time.Duration
		bucket int
	}{
		{0, 0},                      // below range
		{50 * time.Microsecond, 0},  // below range
		{100 * time.Microsecond, 0}, // lower edge
		{ms(1), 10},                 // one decade up
		{ms(1.5), 11},               // 10^(1/10) ≈ 1.26, 10^(2/10) ≈ 1.58
		{ms(10), 20},
		{time.Hour, 59}, // above range
	}
	for _, tt := range tests {
		h := NewHistogram(100*time.Microsecond, 100*time.Second, 10)
		h.Add(tt.d)
		if h.Counts[tt.bucket] != 1 {
			t.Errorf("Histogram.Add(%v) counted in bucket %d; want bucket %d", tt.d, nonZero(h.Counts), tt.bucket)
		}
		if tt.d >= 100*time.Microsecond && tt.d < 100*time.Second {
			if lo, hi := h.Edge(tt.bucket), h.Edge(tt.bucket+1); tt.d < lo-time.Nanosecond || tt.d >= hi {
				t.Errorf("Histogram.Add(%v): bucket %d spans [%v, %v)", tt.d, tt.bucket, lo, hi)
			}
		}
	}
}

func nonZero(counts []int) int {
	for i, c := range counts {
		if c != 0 {
			return i
		}
	}
	return -1
}
