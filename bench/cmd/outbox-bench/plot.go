package main

import (
	"bytes"
	"fmt"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// plots renders the report's figures as SVG files, by name: drain.svg (events/s,
// peak RSS and CPU per event of each system per drain workload), latency.svg
// (commit → ack by percentile, per sink and sustained workload) and soak.svg
// (RSS and latency per minute). Only what was measured is drawn.
func (r *Report) plots() (map[string][]byte, error) {
	out := map[string][]byte{}
	add := func(name string, rows [][]*plot.Plot, w, h vg.Length) error {
		if len(rows) == 0 {
			return nil
		}
		b, err := renderSVG(rows, w, h)
		if err != nil {
			return fmt.Errorf("plot %s: %w", name, err)
		}
		out[name] = b
		return nil
	}
	if err := add("drain.svg", r.drainPlots(), 27*vg.Centimeter, 9*vg.Centimeter); err != nil {
		return nil, err
	}
	if err := add("latency.svg", r.latencyPlots(), 18*vg.Centimeter, 11*vg.Centimeter); err != nil {
		return nil, err
	}
	if r.Soak != nil && len(r.Soak.Minutes) > 0 {
		if err := add("soak.svg", r.Soak.plots(), 18*vg.Centimeter, 16*vg.Centimeter); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// renderSVG draws a grid of plots, their axes aligned, into one SVG.
func renderSVG(rows [][]*plot.Plot, w, h vg.Length) ([]byte, error) {
	c := vgsvg.New(w, h)
	tiles := draw.Tiles{Rows: len(rows), Cols: len(rows[0]), PadX: vg.Centimeter, PadY: vg.Centimeter,
		PadTop: vg.Millimeter * 3, PadBottom: vg.Millimeter * 3, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 3}
	canvases := plot.Align(rows, tiles, draw.New(c))
	for i, row := range rows {
		for j, p := range row {
			if p != nil {
				p.Draw(canvases[i][j])
			}
		}
	}
	var b bytes.Buffer
	if _, err := c.WriteTo(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// drainPlots are three grouped bar charts: one group per drain workload, one
// bar per system.
func (r *Report) drainPlots() [][]*plot.Plot {
	ds := r.Summary.Drains
	if len(ds) == 0 {
		return nil
	}
	type system struct {
		name            string
		rate, rss, cpus func(DrainSummary) float64
	}
	systems := []system{
		{"pg_recvlogical", func(d DrainSummary) float64 { return d.RecvRate }, nil, func(d DrainSummary) float64 { return d.RecvCPUPerMillion }},
		{"outbox-relay", func(d DrainSummary) float64 { return d.RelayRate }, func(d DrainSummary) float64 { return float64(d.PeakRSSMax) / (1 << 20) },
			func(d DrainSummary) float64 { return d.CPUPerMillion }},
	}
	if r.Debezium != nil {
		systems = append(systems, system{"Debezium", func(d DrainSummary) float64 { return d.DbzRate },
			func(d DrainSummary) float64 { return float64(d.DbzPeakRSSMax) / (1 << 20) }, func(d DrainSummary) float64 { return d.DbzCPUPerMillion }})
	}
	names := make([]string, len(ds))
	for i, d := range ds {
		names[i] = fmt.Sprintf("%s per txn", fmtCount(d.PerTxn))
	}
	panel := func(title string, legend bool, value func(system) func(DrainSummary) float64) *plot.Plot {
		p := plot.New()
		p.Title.Text = title
		p.NominalX(names...)
		p.Legend.Top = true
		const width = vg.Length(14)
		top := 0.0
		for i, s := range systems {
			f := value(s)
			if f == nil {
				continue
			}
			vs := make(plotter.Values, len(ds))
			for j, d := range ds {
				vs[j] = f(d)
				top = max(top, vs[j])
			}
			bars, err := plotter.NewBarChart(vs, width)
			if err != nil {
				continue // no value to draw (all zero is still drawn)
			}
			bars.Color = plotutil.Color(i)
			bars.LineStyle.Width = 0
			bars.Offset = width * vg.Length(float64(i)-float64(len(systems)-1)/2)
			p.Add(bars)
			if legend {
				p.Legend.Add(s.name, bars)
			}
		}
		// Room above the bars for the legend: the same colours in every panel.
		p.Y.Min, p.Y.Max = 0, top*1.3
		return p
	}
	return [][]*plot.Plot{{
		panel("drain, events/s (higher is better)", true, func(s system) func(DrainSummary) float64 { return s.rate }),
		panel("peak RSS, MiB", false, func(s system) func(DrainSummary) float64 { return s.rss }),
		panel("CPU s per million events", false, func(s system) func(DrainSummary) float64 { return s.cpus }),
	}}
}

// latencyPlots draw each sustained workload's commit → ack histogram as a
// percentile curve: percentiles on a "nines" axis (p50, p90, p99, …), latency
// on a log axis, so the tail is as readable as the median.
func (r *Report) latencyPlots() [][]*plot.Plot {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("commit → Kafka ack, all runs (%s at the rate)", r.Config.Duration)
	p.X.Label.Text = "percentile"
	p.Y.Label.Text = "ms"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	// Bottom right: the curves rise to the right, so that corner is empty.
	p.Legend.Top, p.Legend.Left = false, false
	nines := plot.ConstantTicks{{Value: 0, Label: "p0"}, {Value: math.Log10(2), Label: "p50"}, {Value: 1, Label: "p90"},
		{Value: 2, Label: "p99"}, {Value: 3, Label: "p99.9"}, {Value: 4, Label: "p99.99"}, {Value: 5, Label: "p99.999"}}
	var lines int
	colors := map[string]int{} // one colour per workload, dashed for Debezium
	for _, w := range r.Summary.Sustained {
		xys := percentileCurve(r.AckHists[workloadKey(w.Sink, w.PerTxn, w.Rate)])
		if len(xys) == 0 {
			continue
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			continue
		}
		wk := workloadKey("", w.PerTxn, w.Rate)
		if _, ok := colors[wk]; !ok {
			colors[wk] = len(colors)
		}
		l.Color = plotutil.Color(colors[wk])
		l.Width = vg.Points(1.5)
		if w.Sink == "debezium" {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
		}
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s, %s per txn at %s events/s", w.Sink, fmtCount(w.PerTxn), fmtRate(w.AchievedRate)), l)
		lines++
	}
	if lines == 0 {
		return nil
	}
	var top float64
	for _, t := range nines {
		if t.Value <= p.X.Max+0.01 {
			top = t.Value
		}
	}
	var ticks plot.ConstantTicks
	for _, t := range nines {
		if t.Value <= top {
			ticks = append(ticks, t)
		}
	}
	p.X.Tick.Marker = ticks
	p.Add(plotter.NewGrid())
	return [][]*plot.Plot{{p}}
}

// percentileCurve turns a histogram into (nines, ms) points: for each
// non-empty bucket, −log10(1 − q) of the fraction q of samples at or below
// its upper edge, and that edge. The last sample (q = 1) is placed one step
// past the highest finite percentile.
func percentileCurve(h *Histogram) plotter.XYs {
	if h == nil {
		return nil
	}
	var n int
	for _, c := range h.Counts {
		n += c
	}
	if n == 0 {
		return nil
	}
	var xys plotter.XYs
	cum := 0
	for i, c := range h.Counts {
		if c == 0 {
			continue
		}
		cum += c
		x := math.Log10(float64(n)) // q = 1: as far as n samples resolve
		if cum < n {
			x = -math.Log10(1 - float64(cum)/float64(n))
		}
		xys = append(xys, plotter.XY{X: x, Y: float64(h.Edge(i+1)) / 1e6})
	}
	return xys
}

// plots are the soak's RSS and latency per minute, one above the other.
func (r *SoakResult) plots() [][]*plot.Plot {
	rss := plot.New()
	rss.Title.Text = "soak: relay RSS per minute (highest sample), MiB"
	lat := plot.New()
	lat.Title.Text = "soak: commit → Kafka ack per minute of commit time, ms"
	lat.X.Label.Text = "minute"
	lat.Legend.Top = true
	var rs, p50, p99, pmax plotter.XYs
	for _, m := range r.Minutes {
		x := float64(m.Minute)
		if m.RSS > 0 {
			rs = append(rs, plotter.XY{X: x, Y: float64(m.RSS) / (1 << 20)})
		}
		if m.Events > 0 && m.P50 > 0 {
			p50 = append(p50, plotter.XY{X: x, Y: float64(m.P50) / 1e6})
			p99 = append(p99, plotter.XY{X: x, Y: float64(m.P99) / 1e6})
			pmax = append(pmax, plotter.XY{X: x, Y: float64(max(m.Max, m.P99)) / 1e6})
		}
	}
	if len(rs) > 0 {
		if l, err := plotter.NewLine(rs); err == nil {
			l.Color = plotutil.Color(1)
			rss.Add(l)
		}
	}
	rss.Y.Min = 0
	if len(p50) > 0 {
		lat.Y.Scale = plot.LogScale{}
		lat.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		for i, s := range []struct {
			name string
			xys  plotter.XYs
		}{{"p50", p50}, {"p99", p99}, {"max", pmax}} {
			if l, err := plotter.NewLine(s.xys); err == nil {
				l.Color = plotutil.Color(i)
				lat.Add(l)
				lat.Legend.Add(s.name, l)
			}
		}
	}
	return [][]*plot.Plot{{rss}, {lat}}
}
