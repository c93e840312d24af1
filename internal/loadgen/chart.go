package loadgen

import (
	"fmt"
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

// WriteChart draws three panels — accepted reservations per second and p99
// request latency over the run, and the distribution of accept → CONFIRMED
// lag — to path (.png or .svg).
func WriteChart(r *Report, path string) error {
	accepted := make(plotter.XYs, len(r.Timeline))
	p99 := make(plotter.XYs, len(r.Timeline))
	for i, b := range r.Timeline {
		t := b.At.Seconds()
		accepted[i] = plotter.XY{X: t, Y: float64(b.Accepted) / b.Width.Seconds()}
		p99[i] = plotter.XY{X: t, Y: float64(b.P99) / float64(time.Millisecond)}
	}
	p1, err := linePlot("Accepted reservations per second", "s since start", "accepted/s", accepted)
	if err != nil {
		return err
	}
	p2, err := linePlot("p99 latency of POST /reservations", "s since start", "ms", p99)
	if err != nil {
		return err
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

func linePlot(title, x, y string, pts plotter.XYs) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = title, x, y
	p.Add(plotter.NewGrid())
	if len(pts) == 0 {
		return p, nil
	}
	l, err := plotter.NewLine(pts)
	if err != nil {
		return nil, err
	}
	p.Add(l)
	return p, nil
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
