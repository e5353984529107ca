// Command figures draws the benchmark's results (the JSON files `make bench`
// writes in bench/) as SVG charts for docs/benchmarks.md, with gonum's plot
// package: the outage of each dataset against its floor and plan's range,
// time against size for the datasets and the phases that ran, and reading
// backup files (time and peak private memory against the file's size). It is
// a module of its own, so that the charting library is never in the tool's
// module graph.
// `make bench` runs it after the benchmark: go run . -in .. -out ../../docs/figures
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// results is what the charts read of a results file (bench/main.go's results).
type results struct {
	Dataset string        `json:"dataset"`
	N       int           `json:"n"`
	Keys    int64         `json:"keys"`
	Date    string        `json:"date"`
	Reps    int           `json:"reps"`
	Meas    []measurement `json:"measurements"`
	Floor   *struct {
		Window   float64 `json:"window"`
		Snapshot float64 `json:"snapshotSave"`
		Ceiling  float64 `json:"ceilingRewrite"`
		Seconds  float64 `json:"floor"`
		Default  float64 `json:"migrateDefaults"`
	} `json:"floor"`
	Machine struct {
		CPUs int    `json:"cpus"`
		CPU  string `json:"cpu"`
	} `json:"machine"`
}

type measurement struct {
	Name    string `json:"name"`
	Samples []struct {
		Seconds      float64 `json:"seconds"`
		Objects      int64   `json:"objects"`
		Bytes        int64   `json:"bytes"`
		PrivateKB    int64   `json:"peakPrivateKiB"`
		EstimateLow  float64 `json:"estimateLow"`
		EstimateHigh float64 `json:"estimateHigh"`
	} `json:"samples"`
}

func (r *results) get(name string) *measurement {
	for i := range r.Meas {
		if r.Meas[i].Name == name && len(r.Meas[i].Samples) > 0 {
			return &r.Meas[i]
		}
	}
	return nil
}

// median of the samples' seconds.
func (m *measurement) seconds() float64 {
	var v []float64
	for _, s := range m.Samples {
		v = append(v, s.Seconds)
	}
	return median(v)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	sort.Float64s(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func main() {
	in := flag.String("in", "..", "directory of the results files (bench/)")
	out := flag.String("out", "../../docs/figures", "directory the SVG files are written to")
	flag.Parse()
	if err := run(*in, *out); err != nil {
		fmt.Fprintln(os.Stderr, "figures:", err)
		os.Exit(1)
	}
}

func run(in, out string) error {
	load := func(name string) (*results, error) {
		b, err := os.ReadFile(filepath.Join(in, name))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		var r results
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return &r, nil
	}
	byName := map[string]*results{}
	for _, f := range []string{"results.json", "results-rotation.json", "results-cr.json", "results-snapshot.json", "results-scale.json", "results-production.json", "results-rollback.json"} {
		r, err := load(f)
		if err != nil {
			return err
		}
		if r != nil {
			byName[f] = r
		}
	}
	var datasets []*results
	for _, f := range []string{"results-cr.json", "results-rotation.json", "results.json"} {
		if r := byName[f]; r != nil && r.Floor != nil {
			datasets = append(datasets, r)
		}
	}
	if len(datasets) == 0 {
		return fmt.Errorf("no dataset with outage rows in %s (results.json, results-rotation.json, results-cr.json)", in)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, c := range []struct {
		file string
		draw func() (*plot.Plot, error)
	}{
		{"outage.svg", func() (*plot.Plot, error) { return outage(datasets) }},
		{"time-vs-size.svg", func() (*plot.Plot, error) { return timeVsSize(datasets, byName) }},
		{"backup-files.svg", func() (*plot.Plot, error) { return backupFiles(byName, false) }},
		{"backup-files-rss.svg", func() (*plot.Plot, error) { return backupFiles(byName, true) }},
	} {
		p, err := c.draw()
		if err != nil {
			return fmt.Errorf("%s: %w", c.file, err)
		}
		if p == nil {
			continue
		}
		path := filepath.Join(out, c.file)
		if err := p.Save(16*vg.Centimeter, 10*vg.Centimeter, path); err != nil {
			return err
		}
		fmt.Println("wrote", path)
	}
	return nil
}

var (
	blue   = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	orange = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
	green  = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}
	grey   = color.RGBA{R: 0x99, G: 0x99, B: 0x99, A: 0xff}
	red    = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	purple = color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}
)

func label(r *results) string { return fmt.Sprintf("%s, %s", r.Dataset, count(float64(r.N))) }

func count(n float64) string {
	switch {
	case n >= 1e6:
		return fmt.Sprintf("%gM", n/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%gk", n/1e3)
	}
	return fmt.Sprintf("%g", n)
}

// outage: per dataset, the floor, migrate at its default flags (the median),
// the engine, and plan's range (from the lowest low to the highest high of
// its repetitions), in seconds.
func outage(ds []*results) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "migrate at its default flags against its floor"
	p.Y.Label.Text = "seconds (process start to exit)"
	p.Legend.Top, p.Legend.Left = true, true
	w := vg.Points(14)
	var floor, def, engine, low, span plotter.Values
	var names []string
	for _, r := range ds {
		names = append(names, label(r))
		floor = append(floor, r.Floor.Seconds)
		def = append(def, r.Floor.Default)
		e := 0.0
		if m := r.get("migrate (engine)"); m != nil {
			e = m.seconds()
		}
		engine = append(engine, e)
		lo, hi := 0.0, 0.0
		if m := r.get("plan"); m != nil {
			for i, s := range m.Samples {
				if i == 0 || s.EstimateLow < lo {
					lo = s.EstimateLow
				}
				hi = max(hi, s.EstimateHigh)
			}
		}
		low, span = append(low, lo), append(span, max(hi-lo, 0))
	}
	bars := []struct {
		name string
		v    plotter.Values
		c    color.Color
	}{{"floor: max(window, snapshot save) + CAS ceiling", floor, grey}, {"migrate (defaults), median", def, blue}, {"engine (--no-undo --allow-live-apiserver)", engine, green}}
	for i, b := range bars {
		bc, err := plotter.NewBarChart(b.v, w)
		if err != nil {
			return nil, err
		}
		bc.Color, bc.LineStyle.Width = b.c, 0
		bc.Offset = w * vg.Length(i-2)
		p.Add(bc)
		p.Legend.Add(b.name, bc)
	}
	// plan's range: an invisible bar up to its low end, its span on top.
	base, err := plotter.NewBarChart(low, w)
	if err != nil {
		return nil, err
	}
	base.Color, base.LineStyle.Width, base.Offset = color.Transparent, 0, w
	rng, err := plotter.NewBarChart(span, w)
	if err != nil {
		return nil, err
	}
	rng.Color, rng.LineStyle.Width, rng.Offset = orange, 0, w
	rng.StackOn(base)
	p.Add(base, rng)
	p.Legend.Add("plan's range (all repetitions)", rng)
	p.NominalX(names...)
	// Room above the bars for the legend.
	top := 0.0
	for i := range def {
		top = max(top, floor[i], def[i], engine[i], low[i]+span[i])
	}
	p.Y.Min, p.Y.Max = 0, top*1.7
	p.Add(plotter.NewGrid())
	return p, nil
}

// timeVsSize: seconds against objects, both logarithmic, for each dataset's
// default migrate, its floor and the CAS ceiling, then the larger runs of the
// phases that ran (live migrate beside the snapshot phase's backup, the
// production phase's migrate --compact-history).
func timeVsSize(ds []*results, byName map[string]*results) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "time against size"
	p.X.Label.Text = "objects in etcd"
	p.Y.Label.Text = "seconds"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = logTicks{count}, logTicks{seconds}
	p.Legend.Top, p.Legend.Left = true, true
	series := []struct {
		name string
		get  func(r *results) float64
		c    color.Color
		s    draw.GlyphDrawer
	}{
		{"migrate (defaults)", func(r *results) float64 { return r.Floor.Default }, blue, draw.CircleGlyph{}},
		{"its floor", func(r *results) float64 { return r.Floor.Seconds }, grey, draw.BoxGlyph{}},
		{"engine", func(r *results) float64 { return secondsOf(r, "migrate (engine)") }, green, draw.TriangleGlyph{}},
		{"CAS ceiling", func(r *results) float64 { return secondsOf(r, "CAS ceiling") }, purple, draw.PlusGlyph{}},
	}
	for _, s := range series {
		var xys plotter.XYs
		for _, r := range ds {
			if v := s.get(r); v > 0 && r.Keys > 0 {
				xys = append(xys, plotter.XY{X: float64(r.Keys), Y: v})
			}
		}
		if len(xys) == 0 {
			continue
		}
		sort.Slice(xys, func(i, j int) bool { return xys[i].X < xys[j].X })
		sc, err := plotter.NewScatter(xys)
		if err != nil {
			return nil, err
		}
		sc.Color, sc.Shape, sc.Radius = s.c, s.s, vg.Points(3)
		p.Add(sc)
		p.Legend.Add(s.name+" (cr, rotation, mixed)", sc)
	}
	var more plotter.XYs
	var names []string
	if r := byName["results-snapshot.json"]; r != nil {
		if m := r.get("migrate (live etcd)"); m != nil {
			more = append(more, plotter.XY{X: float64(m.Samples[0].Objects), Y: m.seconds()})
			names = append(names, fmt.Sprintf("live migrate, 1M (snapshot phase, %s)", r.Date[:10]))
		}
	}
	if r := byName["results-production.json"]; r != nil {
		if m := r.get("migrate --compact-history"); m != nil {
			more = append(more, plotter.XY{X: float64(m.Samples[0].Objects), Y: m.seconds()})
			names = append(names, fmt.Sprintf("--compact-history, 4M near the quota (%s)", r.Date[:10]))
		}
	}
	if len(more) > 0 {
		sc, err := plotter.NewScatter(more)
		if err != nil {
			return nil, err
		}
		sc.Color, sc.Shape, sc.Radius = red, draw.CrossGlyph{}, vg.Points(4)
		p.Add(sc)
		p.Legend.Add("larger runs (labelled)", sc)
		l, err := plotter.NewLabels(plotter.XYLabels{XYs: more, Labels: names})
		if err != nil {
			return nil, err
		}
		for i := range l.TextStyle {
			l.TextStyle[i].Font.Size = vg.Points(7)
			l.TextStyle[i].XAlign = draw.XRight
		}
		p.Add(l)
	}
	p.Add(plotter.NewGrid())
	return p, nil
}

// logTicks marks a logarithmic axis at 1, 2 and 5 times each power of ten,
// each labelled by format.
type logTicks struct{ format func(float64) string }

func (t logTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, m := range []float64{1, 2, 5} {
			if v := m * math.Pow(10, e); v >= lo && v <= hi {
				ticks = append(ticks, plot.Tick{Value: v, Label: t.format(v)})
			}
		}
	}
	return ticks
}

func seconds(v float64) string { return fmt.Sprintf("%g s", v) }

func secondsOf(r *results, name string) float64 {
	if m := r.get(name); m != nil {
		return m.seconds()
	}
	return 0
}

// backupFiles: verify --snapshot-file's time (rss: its peak private memory,
// RssAnon, with the bounds) against the file's size, from the scale phase
// (files N and 4N), the snapshot phase and the production phase. A results
// file written before the private figure was sampled (peakRSSKiB only) has no
// point on the memory chart.
func backupFiles(byName map[string]*results, rss bool) (*plot.Plot, error) {
	type point struct {
		gb, v float64
		name  string
	}
	var pts []point
	add := func(file, meas, name string) {
		r := byName[file]
		if r == nil {
			return
		}
		m := r.get(meas)
		if m == nil || m.Samples[0].Bytes <= 0 {
			return
		}
		v := m.seconds()
		if rss {
			var peaks []float64
			for _, s := range m.Samples {
				if s.PrivateKB > 0 {
					peaks = append(peaks, float64(s.PrivateKB)/1024)
				}
			}
			if len(peaks) == 0 {
				return
			}
			v = median(peaks)
		}
		pts = append(pts, point{float64(m.Samples[0].Bytes) / 1e9, v, fmt.Sprintf("%s (%s)", name, r.Date[:10])})
	}
	add("results-scale.json", "verify --snapshot N", "scale N")
	add("results-scale.json", "verify --snapshot 4N", "scale 4N")
	add("results-snapshot.json", "verify --snapshot", "1M mixed")
	add("results-production.json", "verify --snapshot-file", "4M, production")
	if len(pts) == 0 {
		return nil, nil
	}
	sort.Slice(pts, func(i, j int) bool { return pts[i].gb < pts[j].gb })
	p := plot.New()
	p.X.Label.Text = "backup file, GB"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, logTicks{func(v float64) string { return fmt.Sprintf("%g", v) }}
	if rss {
		p.Title.Text = "verify --snapshot-file: peak private memory against the file's size"
		p.Y.Label.Text = "peak private memory, MB (RssAnon)"
		p.Y.Min, p.Y.Max = 0, 200
	} else {
		p.Title.Text = "verify --snapshot-file: time against the file's size"
		p.Y.Label.Text = "seconds"
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, logTicks{seconds}
	}
	var xys plotter.XYs
	var names []string
	for _, pt := range pts {
		xys = append(xys, plotter.XY{X: pt.gb, Y: pt.v})
		names = append(names, pt.name)
	}
	line, sc, err := plotter.NewLinePoints(xys)
	if err != nil {
		return nil, err
	}
	line.Color, sc.Color, sc.Radius = blue, blue, vg.Points(3)
	p.Add(line, sc)
	l, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: names})
	if err != nil {
		return nil, err
	}
	for i := range l.TextStyle {
		l.TextStyle[i].Font.Size = vg.Points(7)
	}
	p.Add(l)
	if rss {
		bound, err := plotter.NewLine(plotter.XYs{{X: pts[0].gb, Y: 150}, {X: pts[len(pts)-1].gb, Y: 150}})
		if err != nil {
			return nil, err
		}
		bound.Color, bound.Dashes = red, []vg.Length{vg.Points(4), vg.Points(2)}
		prod, err := plotter.NewLine(plotter.XYs{{X: pts[0].gb, Y: 100}, {X: pts[len(pts)-1].gb, Y: 100}})
		if err != nil {
			return nil, err
		}
		prod.Color, prod.Dashes = grey, []vg.Length{vg.Points(2), vg.Points(2)}
		p.Add(bound, prod)
		p.Legend.Add("the 150 MB bound (scale and snapshot phases)", bound)
		p.Legend.Add("100 MB: the production rows' bound (issue 55)", prod)
		p.Legend.Top = true
	}
	p.Add(plotter.NewGrid())
	return p, nil
}
