package loadgen

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// WriteChart draws three panels — accepted and sold-out answers per second
// and p99 request latency over the run (a gap where no request started),
// and the distribution of accept → CONFIRMED lag — to path (.png or .svg).
func WriteChart(r *Report, path string) error {
	accepted := make(plotter.XYs, len(r.Timeline))
	soldOut := make(plotter.XYs, len(r.Timeline))
	for i, b := range r.Timeline {
		t := b.At.Seconds()
		accepted[i] = plotter.XY{X: t, Y: float64(b.Accepted) / b.Width.Seconds()}
		soldOut[i] = plotter.XY{X: t, Y: float64(b.SoldOut) / b.Width.Seconds()}
	}
	p1, err := linePlot("Answers per second: accepted and sold out", "s since start", "answers/s",
		series{"accepted/s", accepted}, series{"sold out/s", soldOut})
	if err != nil {
		return err
	}
	var p99 []series
	for _, seg := range P99Segments(r.Timeline) {
		p99 = append(p99, series{"", seg})
	}
	p2, err := linePlot("p99 latency of POST /reservations", "s since start", "ms", p99...)
	if err != nil {
		return err
	}
	if n := len(r.Timeline); n > 0 { // the run's whole span, gaps included
		p1.X.Min, p2.X.Min = 0, 0
		p1.X.Max = r.Timeline[n-1].At.Seconds()
		p2.X.Max = p1.X.Max
	}
	p3, err := lagPlot(r)
	if err != nil {
		return err
	}

	const w, h = 8 * vg.Inch, 9 * vg.Inch
	var canvas vg.CanvasWriterTo
	switch strings.ToLower(filepath.Ext(path)) {
	case ".svg":
		canvas = vgsvg.New(w, h)
	case ".png":
		canvas = vgimg.PngCanvas{Canvas: vgimg.New(w, h)}
	default:
		return fmt.Errorf("chart %s: use .png or .svg", path)
	}
	dc := draw.New(canvas.(vg.CanvasSizer))
	tiles := draw.Tiles{Rows: 3, Cols: 1, PadY: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	plots := [][]*plot.Plot{{p1}, {p2}, {p3}}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := canvas.WriteTo(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// series is one line of a panel; an unnamed one has no legend entry.
type series struct {
	name string
	pts  plotter.XYs
}

func linePlot(title, x, y string, lines ...series) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = title, x, y
	p.Add(plotter.NewGrid())
	for i, s := range lines {
		if len(s.pts) == 0 {
			continue
		}
		l, pts, err := plotter.NewLinePoints(s.pts)
		if err != nil {
			return nil, err
		}
		color := plotutilColor(i)
		if s.name == "" {
			color = plotutilColor(0)
		}
		l.Color, pts.Color = color, color
		pts.Radius = vg.Points(1.5)
		p.Add(l, pts)
		if s.name != "" {
			p.Legend.Add(s.name, l)
		}
	}
	p.Legend.Top = true
	return p, nil
}

// P99Segments returns the p99 latency (ms) of the buckets where requests
// started, split where none did: an empty interval is a gap in the line,
// never a 0 ms point.
func P99Segments(timeline []Bucket) []plotter.XYs {
	var out []plotter.XYs
	var cur plotter.XYs
	for _, b := range timeline {
		if b.Requests == 0 {
			if len(cur) > 0 {
				out = append(out, cur)
			}
			cur = nil
			continue
		}
		cur = append(cur, plotter.XY{X: b.At.Seconds(), Y: float64(b.P99) / float64(time.Millisecond)})
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

func plotutilColor(i int) color.Color {
	palette := []color.Color{color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}}
	return palette[i%len(palette)]
}

// lagPlot is the CDF of accept → CONFIRMED lag: the share of confirmed
// reservations seen CONFIRMED within x ms.
func lagPlot(r *Report) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Accept → CONFIRMED (p50 %v, p99 %v)", r.Lag.P50.Round(time.Millisecond), r.Lag.P99.Round(time.Millisecond))
	p.X.Label.Text, p.Y.Label.Text = "ms", "share confirmed"
	p.Add(plotter.NewGrid())
	if len(r.lags) == 0 {
		return p, nil
	}
	lags := append([]time.Duration(nil), r.lags...)
	sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
	pts := make(plotter.XYs, len(lags))
	for i, d := range lags {
		pts[i] = plotter.XY{X: float64(d) / float64(time.Millisecond), Y: float64(i+1) / float64(len(lags))}
	}
	l, err := plotter.NewLine(pts)
	if err != nil {
		return nil, err
	}
	p.Add(l)
	return p, nil
}
