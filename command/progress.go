package command

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"kube-etcd-migrate/pipeline"
)

// countKeys counts the selected keys (count-only range requests are cheap) for the
// progress bar; 0 when unknown.
func countKeys(ctx context.Context, env *pipeline.Env) int64 {
	var n int64
	for _, p := range env.Prefixes {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		count, err := env.Source.Count(ctx, p)
		cancel()
		if err != nil {
			return 0
		}
		n += count
	}
	return n
}

// progress shows a bar on a terminal and a log line every 10 s otherwise.
type progress struct {
	bar   *progressbar.ProgressBar
	w     io.Writer
	label string
	total int64
	last  time.Time
	start time.Time
	n     int64
}

func newProgress(w io.Writer, label string, total int64) *progress {
	p := &progress{w: w, label: label, total: total, start: time.Now(), last: time.Now()}
	// The bar goes to the terminal itself: a run's saved output has the
	// lines printed where there is none.
	if f, ok := terminalOf(w); ok && term.IsTerminal(int(f.Fd())) {
		p.bar = progressbar.NewOptions64(max(total, -1),
			progressbar.OptionSetWriter(f),
			progressbar.OptionSetDescription(label),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("keys"),
			progressbar.OptionThrottle(200*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)
	}
	return p
}

// Set records how many keys have been processed.
func (p *progress) Set(n int64) {
	p.n = n
	if p.bar != nil {
		_ = p.bar.Set64(n)
		return
	}
	if time.Since(p.last) >= 10*time.Second {
		p.last = time.Now()
		rate := float64(n) / time.Since(p.start).Seconds()
		if p.total > 0 {
			fmt.Fprintf(p.w, "%s: %d/%d keys (%.0f%%), %.0f keys/s\n", p.label, n, p.total, 100*float64(n)/float64(p.total), rate)
		} else {
			fmt.Fprintf(p.w, "%s: %d keys, %.0f keys/s\n", p.label, n, rate)
		}
	}
}

func (p *progress) Finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}
