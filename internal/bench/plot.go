package bench

import (
	"bytes"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// series is one line of a chart: a name, a colour and a value per
// sample; NaN-free, since a sample with nothing to show is left out by
// its func returning false.
type series struct {
	name  string
	color color.Color
	value func(Sample) (float64, bool)
}

var (
	blue   = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	orange = color.RGBA{R: 255, G: 127, B: 14, A: 255}
	green  = color.RGBA{R: 44, G: 160, B: 44, A: 255}
	red    = color.RGBA{R: 214, G: 39, B: 40, A: 255}
	purple = color.RGBA{R: 148, G: 103, B: 189, A: 255}
	grey   = color.RGBA{R: 127, G: 127, B: 127, A: 255}
)

func always(f func(Sample) float64) func(Sample) (float64, bool) {
	return func(s Sample) (float64, bool) { return f(s), true }
}

// panels returns the charts of a timeline, top to bottom: rates,
// latencies, connected users (users scenario), CPU, memory. Panels with
// nothing to show are left out.
func panels(tl Timeline) []*plot.Plot {
	var users, published, offered, delivery, serverCPU, rss bool
	for _, s := range tl.Samples {
		users = users || s.Users > 0
		published = published || s.Published > 0
		offered = offered || s.Offered > 0
		delivery = delivery || s.Delivery.Count > 0
		serverCPU = serverCPU || s.ServerCPU >= 0
		rss = rss || s.ServerRSS > 0
	}
	ms := func(f func(Latency) float64, pick func(Sample) Latency) func(Sample) (float64, bool) {
		return func(s Sample) (float64, bool) {
			l := pick(s)
			return f(l) / 1e3, l.Count > 0
		}
	}
	lat := func(s Sample) Latency { return s.Latency }
	del := func(s Sample) Latency { return s.Delivery }

	rates := []series{
		{"sent", blue, always(func(s Sample) float64 { return s.Sent })},
		{"received", orange, always(func(s Sample) float64 { return s.Received })},
	}
	if users {
		rates[0].name, rates[1].name = "requests", "deliveries"
	}
	rates[0].name = or(tl.SentName, rates[0].name)
	rates[1].name = or(tl.ReceivedName, rates[1].name)
	if published {
		rates = append(rates,
			series{"published", green, always(func(s Sample) float64 { return s.Published })},
			series{"requests + published", purple, always(func(s Sample) float64 { return s.Sent + s.Published })})
	}
	if offered {
		rates = append(rates, series{"offered", grey, always(func(s Sample) float64 { return s.Offered })})
	}
	latName := "latency"
	if users {
		latName = "request"
	}
	latName = or(tl.LatencyName, latName)
	delName := or(tl.DeliveryName, "delivery")
	lats := []series{
		{latName + " p50", blue, ms(func(l Latency) float64 { return l.P50 }, lat)},
		{latName + " p99", orange, ms(func(l Latency) float64 { return l.P99 }, lat)},
		{latName + " max", red, ms(func(l Latency) float64 { return l.Max }, lat)},
	}
	if delivery {
		lats = append(lats,
			series{delName + " p50", green, ms(func(l Latency) float64 { return l.P50 }, del)},
			series{delName + " p99", purple, ms(func(l Latency) float64 { return l.P99 }, del)})
	}
	ps := []*plot.Plot{
		chart(tl, tl.Title, "per second", rates),
		chart(tl, "", "latency (ms)", lats),
	}
	if users {
		ps = append(ps, chart(tl, "", "connected users", []series{
			{"users", blue, always(func(s Sample) float64 { return float64(s.Users) })},
		}))
	}
	cpu := []series{{"client", blue, always(func(s Sample) float64 { return s.ClientCPU })}}
	if serverCPU {
		cpu = append(cpu, series{"server", orange, func(s Sample) (float64, bool) { return s.ServerCPU, s.ServerCPU >= 0 }})
	}
	ps = append(ps, chart(tl, "", "CPU (cores)", cpu))
	if rss {
		ps = append(ps, chart(tl, "", "server RSS (MB)", []series{
			{"server RSS", orange, func(s Sample) (float64, bool) { return float64(s.ServerRSS) / 1e6, s.ServerRSS > 0 }},
		}))
	}
	ps[len(ps)-1].X.Label.Text = "seconds"
	if tl.ByDepth {
		ps[len(ps)-1].X.Label.Text = "queue depth (messages)"
	}
	return ps
}

// or returns s, or def if s is empty.
func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// x returns a sample's place on the charts' horizontal axis.
func (tl Timeline) x(s Sample) float64 {
	if tl.ByDepth {
		return float64(s.Depth)
	}
	return s.T
}

func chart(tl Timeline, title, ylabel string, ss []series) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	for _, s := range ss {
		var xys plotter.XYs
		for _, smp := range tl.Samples {
			if v, ok := s.value(smp); ok {
				xys = append(xys, plotter.XY{X: tl.x(smp), Y: v})
			}
		}
		if len(xys) == 0 {
			continue
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			continue
		}
		l.Color = s.color
		l.Width = vg.Points(1.2)
		p.Add(l)
		p.Legend.Add(s.name, l)
	}
	return p
}

// WritePlot draws a timeline's rates, latencies, users, CPU and memory
// over time, one chart under the other, as SVG or PNG.
func WritePlot(w io.Writer, tl Timeline, format string) error {
	if len(tl.Samples) == 0 {
		return fmt.Errorf("bench: plot: no samples (the run was shorter than one interval)")
	}
	ps := panels(tl)
	width, height := 10*vg.Inch, vg.Length(len(ps))*2.3*vg.Inch
	var (
		c  draw.Canvas
		wt io.WriterTo
	)
	switch format {
	case "svg":
		svg := vgsvg.New(width, height)
		c, wt = draw.New(svg), svg
	case "png":
		img := vgimg.New(width, height)
		c, wt = draw.New(img), vgimg.PngCanvas{Canvas: img}
	default:
		return fmt.Errorf("bench: plot: format %q: want svg or png", format)
	}
	grid := make([][]*plot.Plot, len(ps))
	for i, p := range ps {
		grid[i] = []*plot.Plot{p}
	}
	t := draw.Tiles{Rows: len(ps), Cols: 1, PadX: vg.Millimeter, PadY: 3 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 4 * vg.Millimeter}
	canvases := plot.Align(grid, t, c)
	for i, p := range ps {
		p.Draw(canvases[i][0])
	}
	_, err := wt.WriteTo(w)
	return err
}

// WritePlotFile writes a timeline's chart to a file, in the format of its
// extension: .svg or .png.
func WritePlotFile(path string, tl Timeline) error {
	format := strings.TrimPrefix(strings.ToLower(filepath.Ext(path)), ".")
	var b bytes.Buffer
	if err := WritePlot(&b, tl, format); err != nil {
		return err
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("bench: plot: %w", err)
	}
	return nil
}
