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
//
// groups, when any, are drawn above the histograms as horizontal bars: the
// side-by-side comparison of the relay and its peers.
func writeSVG(w io.Writer, panels []histPanel, groups []barGroup) error {
	var b strings.Builder
	barsH := barsHeight(groups)
	height := len(panels)*panelH + 40 + barsH
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n",
		svgWidth, height, svgWidth, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	for i, name := range bandNames {
		x := marginL + i*120
		fmt.Fprintf(&b, `<rect x="%d" y="12" width="12" height="12" fill="%s"/><text x="%d" y="22">%s</text>`+"\n",
			x, bandColors[i], x+16, html.EscapeString(name))
	}
	drawBars(&b, groups, 40)
	for i, p := range panels {
		drawPanel(&b, p, 40+barsH+i*panelH)
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

// A barGroup is one measure compared across the relay and its peers.
type barGroup struct {
	Title string
	Bars  []bar
}

type bar struct {
	Label string
	Value float64
	Text  string // printed after the bar
}

const (
	barH      = 18
	barLabelW = 190
)

func barsHeight(groups []barGroup) int {
	h := 0
	for _, g := range groups {
		h += 28 + len(g.Bars)*(barH+4) + 10
	}
	return h
}

// drawBars draws each group's bars scaled to the group's largest value.
func drawBars(b *strings.Builder, groups []barGroup, top int) {
	y := top
	plotW := float64(svgWidth - marginL - barLabelW - 150)
	for _, g := range groups {
		fmt.Fprintf(b, `<text x="%d" y="%d" font-size="13" font-weight="bold">%s</text>`+"\n", marginL, y+18, html.EscapeString(g.Title))
		y += 28
		peak := 0.0
		for _, br := range g.Bars {
			peak = math.Max(peak, br.Value)
		}
		for i, br := range g.Bars {
			w := 0.0
			if peak > 0 {
				w = math.Max(br.Value/peak*plotW, 1)
			}
			x := float64(marginL + barLabelW)
			fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="end">%s</text><rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"/><text x="%.1f" y="%d">%s</text>`+"\n",
				x-6, y+13, html.EscapeString(br.Label), x, y, w, barH, bandColors[i%len(bandColors)], x+w+6, y+13, html.EscapeString(br.Text))
			y += barH + 4
		}
		y += 10
	}
}

// comparisonBars are the drain's events/s, peak RSS and CPU per event of
// pg_recvlogical, the relay and Debezium, when a peer ran.
func comparisonBars(r *Report) []barGroup {
	s := r.Summary
	if s.DbzRuns == 0 || s.RelayRuns == 0 {
		return nil
	}
	dbz := "Debezium " + dbzVersion
	rate := barGroup{Title: "drain, events/s (higher is better)"}
	if s.RecvRuns > 0 {
		rate.Bars = append(rate.Bars, bar{"pg_recvlogical", s.RecvRate, fmtRate(s.RecvRate)})
	}
	rate.Bars = append(rate.Bars,
		bar{"outbox-relay", s.RelayRate, fmtRate(s.RelayRate)},
		bar{dbz, s.DbzRate, fmt.Sprintf("%s (relay %.1f ×)", fmtRate(s.DbzRate), s.DbzRatio)})
	return []barGroup{
		rate,
		{Title: "drain, peak RSS (lower is better)", Bars: []bar{
			{"outbox-relay", float64(s.PeakRSSMax), fmtMB(s.PeakRSSMax)},
			{dbz, float64(s.DbzPeakRSSMax), fmtMB(s.DbzPeakRSSMax)},
		}},
		{Title: "drain, CPU seconds per million events (lower is better)", Bars: []bar{
			{"outbox-relay", s.CPUPerMillion, fmt.Sprintf("%.2f", s.CPUPerMillion)},
			{dbz, s.DbzCPUPerMillion, fmt.Sprintf("%.2f", s.DbzCPUPerMillion)},
		}},
	}
}

// writeSoakSVG draws the soak's per-minute RSS and commit→ack p50/p99 as two
// line charts over the minutes.
func writeSoakSVG(w io.Writer, r *SoakResult) error {
	var b strings.Builder
	height := 2*panelH + 20
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n",
		svgWidth, height, svgWidth, height)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	xs := make([]float64, len(r.Minutes))
	rss := make([]float64, len(r.Minutes))
	p50 := make([]float64, len(r.Minutes))
	p99 := make([]float64, len(r.Minutes))
	for i, m := range r.Minutes {
		xs[i] = float64(m.Minute)
		rss[i] = float64(m.RSS) / (1 << 20)
		p50[i] = float64(m.P50) / float64(time.Millisecond)
		p99[i] = float64(m.P99) / float64(time.Millisecond)
	}
	drawLines(&b, fmt.Sprintf("relay RSS per minute, MiB (first %d min median %s, last %s)", r.Window, fmtMB(r.RSSFirst), fmtMB(r.RSSLast)),
		xs, []line{{"RSS", bandColors[0], rss}}, 10)
	drawLines(&b, fmt.Sprintf("commit → Kafka ack per minute, ms (p99: first %d min median %s, last %s)", r.Window, fmtDur(r.P99First), fmtDur(r.P99Last)),
		xs, []line{{"p50", bandColors[0], p50}, {"p99", bandColors[3], p99}}, 10+panelH)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

type line struct {
	Name, Color string
	Y           []float64
}

// drawLines draws lines over xs on a linear axis from 0 to the largest value.
func drawLines(b *strings.Builder, title string, xs []float64, lines []line, top int) {
	plotW := float64(svgWidth - marginL - marginR)
	y0 := float64(top + marginTop + plotHeight)
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="13" font-weight="bold">%s</text>`+"\n", marginL, top+marginTop-18, html.EscapeString(title))
	fmt.Fprintf(b, `<line x1="%d" y1="%.0f" x2="%.0f" y2="%.0f" stroke="black"/><line x1="%d" y1="%.0f" x2="%d" y2="%.0f" stroke="black"/>`+"\n",
		marginL, y0, float64(marginL)+plotW, y0, marginL, y0, marginL, y0-plotHeight)
	if len(xs) == 0 {
		fmt.Fprintf(b, `<text x="%d" y="%.0f">no samples</text>`+"\n", marginL+10, y0-plotHeight/2)
		return
	}
	peak := 0.0
	for _, l := range lines {
		for _, v := range l.Y {
			peak = math.Max(peak, v)
		}
	}
	if peak == 0 {
		peak = 1
	}
	peak *= 1.1
	lo, hi := xs[0], xs[len(xs)-1]
	px := func(x float64) float64 {
		if hi == lo {
			return float64(marginL) + plotW/2
		}
		return float64(marginL) + (x-lo)/(hi-lo)*plotW
	}
	py := func(v float64) float64 { return y0 - v/peak*plotHeight }
	for k, l := range lines {
		var pts strings.Builder
		for i, v := range l.Y {
			fmt.Fprintf(&pts, "%.1f,%.1f ", px(xs[i]), py(v))
		}
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", l.Color, strings.TrimSpace(pts.String()))
		lx := float64(svgWidth-marginR-140) + float64(k*70)
		fmt.Fprintf(b, `<rect x="%.0f" y="%d" width="12" height="3" fill="%s"/><text x="%.0f" y="%d">%s</text>`+"\n",
			lx, top+marginTop-22, l.Color, lx+16, top+marginTop-17, html.EscapeString(l.Name))
	}
	for _, f := range []float64{0, 0.25, 0.5, 0.75, 1} {
		v := f * peak / 1.1
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", marginL-4, py(v)+4, trimFloat(v))
	}
	step := max(1, len(xs)/10)
	for i := 0; i < len(xs); i += step {
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" text-anchor="middle">%g</text>`+"\n", px(xs[i]), y0+16, xs[i])
	}
	fmt.Fprintf(b, `<text x="%d" y="%.0f" text-anchor="middle">minute</text>`+"\n", marginL+int(plotW)/2, y0+32)
}
