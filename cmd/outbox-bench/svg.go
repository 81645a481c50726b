package main

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
	"time"
)

// A histPanel is one latency distribution drawn as one chart.
type histPanel struct {
	Title string
	Hist  *Histogram
	Lat   Latency
}

// Band colours, from the bulk of events to the tail.
var bandColors = []string{"#4c78a8", "#72b7b2", "#f58518", "#e45756"}
var bandNames = []string{"≤ p50", "p50–p95", "p95–p99", "> p99"}

const (
	svgWidth   = 820
	panelH     = 260
	marginL    = 70
	marginR    = 20
	marginTop  = 40
	plotHeight = 170
)

// writeSVG draws each panel as a histogram with a logarithmic latency axis,
// bars coloured by the percentile band they fall in, and the p50/p95/p99
// positions marked. Only buckets between the first and last non-empty one are
// drawn, so the chart zooms to the data.
func writeSVG(w io.Writer, panels []histPanel) error {
	var b strings.Builder
	height := len(panels)*panelH + 40
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n",
		svgWidth, height, svgWidth, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	for i, name := range bandNames {
		x := marginL + i*120
		fmt.Fprintf(&b, `<rect x="%d" y="12" width="12" height="12" fill="%s"/><text x="%d" y="22">%s</text>`+"\n",
			x, bandColors[i], x+16, html.EscapeString(name))
	}
	for i, p := range panels {
		drawPanel(&b, p, 40+i*panelH)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func drawPanel(b *strings.Builder, p histPanel, top int) {
	plotW := svgWidth - marginL - marginR
	y0 := top + marginTop + plotHeight // baseline
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="13" font-weight="bold">%s</text>`+"\n",
		marginL, top+marginTop-18, html.EscapeString(fmt.Sprintf("%s (n=%d, p50 %s, p95 %s, p99 %s, max %s)",
			p.Title, p.Lat.Count, fmtDur(p.Lat.P50), fmtDur(p.Lat.P95), fmtDur(p.Lat.P99), fmtDur(p.Lat.Max))))
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", marginL, y0, marginL+plotW, y0)
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", marginL, y0, marginL, y0-plotHeight)

	h := p.Hist
	first, last := -1, -1
	peak := 0
	for i, c := range h.Counts {
		if c > 0 {
			if first < 0 {
				first = i
			}
			last = i
			peak = max(peak, c)
		}
	}
	if first < 0 {
		fmt.Fprintf(b, `<text x="%d" y="%d">no samples</text>`+"\n", marginL+10, y0-plotHeight/2)
		return
	}
	first, last = max(first-1, 0), min(last+1, len(h.Counts)-1)
	n := last - first + 1
	barW := float64(plotW) / float64(n)
	// x maps a latency to the log-scale axis.
	lo, hi := math.Log10(float64(h.Edge(first))), math.Log10(float64(h.Edge(last+1)))
	x := func(d time.Duration) float64 {
		if d <= 0 {
			return float64(marginL)
		}
		f := (math.Log10(float64(d)) - lo) / (hi - lo)
		return float64(marginL) + math.Min(math.Max(f, 0), 1)*float64(plotW)
	}
	for i := first; i <= last; i++ {
		c := h.Counts[i]
		if c == 0 {
			continue
		}
		mid := time.Duration(math.Sqrt(float64(h.Edge(i)) * float64(h.Edge(i+1))))
		bh := float64(c) / float64(peak) * plotHeight
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s–%s: %d</title></rect>`+"\n",
			float64(marginL)+float64(i-first)*barW+0.5, float64(y0)-bh, math.Max(barW-1, 0.5), bh,
			bandColors[band(mid, p.Lat)], fmtDur(h.Edge(i)), fmtDur(h.Edge(i+1)), c)
	}
	// Decade ticks: 1, 2 and 5 of each power of ten inside the range.
	for e := math.Floor(lo); e <= math.Ceil(hi); e++ {
		for _, m := range []float64{1, 2, 5} {
			d := time.Duration(m * math.Pow(10, e))
			if math.Log10(float64(d)) < lo || math.Log10(float64(d)) > hi {
				continue
			}
			tx := x(d)
			fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black"/><text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n",
				tx, y0, tx, y0+4, tx, y0+16, fmtDur(d))
		}
	}
	// Percentile markers; labels are staggered because p95 and p99 are often
	// a bucket apart.
	for k, m := range []struct {
		name string
		d    time.Duration
	}{{"p50", p.Lat.P50}, {"p95", p.Lat.P95}, {"p99", p.Lat.P99}} {
		mx := x(m.d)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#333" stroke-dasharray="4,3"/><text x="%.1f" y="%d">%s</text>`+"\n",
			mx, y0, mx, y0-plotHeight, mx+3, y0-plotHeight+10+12*k, m.name)
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">latency (log scale)</text>`+"\n", marginL+plotW/2, y0+32)
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">%d</text><text x="%d" y="%d" text-anchor="end">0</text>`+"\n",
		marginL-4, y0-plotHeight+4, peak, marginL-4, y0)
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle" transform="rotate(-90 %d %d)">events</text>`+"\n",
		marginL-40, y0-plotHeight/2, marginL-40, y0-plotHeight/2)
}

// band returns the percentile band a latency falls in.
func band(d time.Duration, l Latency) int {
	switch {
	case d <= l.P50:
		return 0
	case d <= l.P95:
		return 1
	case d <= l.P99:
		return 2
	default:
		return 3
	}
}

// fmtDur prints a latency compactly with about three significant digits.
func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "0"
	case d < time.Millisecond:
		return trimFloat(float64(d)/float64(time.Microsecond)) + "µs"
	case d < time.Second:
		return trimFloat(float64(d)/float64(time.Millisecond)) + "ms"
	default:
		return trimFloat(d.Seconds()) + "s"
	}
}

func trimFloat(f float64) string {
	var s string
	switch {
	case f >= 100:
		s = fmt.Sprintf("%.0f", f)
	case f >= 10:
		s = fmt.Sprintf("%.1f", f)
	default:
		s = fmt.Sprintf("%.2f", f)
	}
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}
