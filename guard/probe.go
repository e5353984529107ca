package guard

import (
	"context"
	"fmt"
	"sync"
	"time"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/liveness"
)

// probeInterval is how often a probe watch looks for another holder.
const probeInterval = 250 * time.Millisecond

// probeWatch is the liveness watch of a datastore no one writes without
// holding its file open (a SQLite database served through kine in the
// tool's process): another process holding it is the other writer (k3s
// started), looked for at once and then every probeInterval.
type probeWatch struct {
	what    string
	clients bool
	probe   func() (string, error)

	mu   sync.Mutex
	err  error
	stop chan struct{}
	done chan struct{}
}

// StartProbeWatch is the run's watch of the datastore what (e.g. "the
// SQLite datastore /var/lib/.../state.db"), probe naming the other
// processes that hold it open ("" while none does), or, with clients, the
// other clients connected to it (a database server's: "the PostgreSQL
// datastore k3s on db:5432"). It stops the run, as a writer seen in etcd
// does (a *liveness.WriterError), when one appears.
func StartProbeWatch(what string, clients bool, probe func() (string, error)) *Watch {
	p := &probeWatch{what: what, clients: clients, probe: probe, stop: make(chan struct{}), done: make(chan struct{})}
	p.look()
	go func() {
		defer close(p.done)
		t := time.NewTicker(probeInterval)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				if p.look() != nil {
					return
				}
			}
		}
	}()
	return &Watch{probe: p}
}

// look probes once, keeping the first error.
func (p *probeWatch) look() error {
	who, err := p.probe()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return p.err
	}
	switch {
	case err != nil && p.clients:
		p.err = fmt.Errorf("watching who is connected to %s: %w", p.what, err)
	case err != nil:
		p.err = fmt.Errorf("watching who holds %s open: %w", p.what, err)
	case who != "" && p.clients:
		p.err = &liveness.WriterError{Opened: fmt.Sprintf("%s was connected to by %s", p.what, who)}
	case who != "":
		p.err = &liveness.WriterError{Opened: fmt.Sprintf("%s was opened by %s", p.what, who)}
	}
	return p.err
}

func (p *probeWatch) stopped() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

func (p *probeWatch) close() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

// verdict is the window's: the datastore held by no one else now.
func (p *probeWatch) verdict(context.Context) (string, error) {
	if err := p.look(); err != nil {
		return "", &PreflightError{Err: err}
	}
	if p.clients {
		return fmt.Sprintf("no other client is connected to %s (the only way to write it)", p.what), nil
	}
	return fmt.Sprintf("no other process holds %s open (the only way to write it)", p.what), nil
}

// settle looks once more after the run's last write.
func (p *probeWatch) settle(context.Context) error { return p.look() }

// Sending refuses a write once another holder was seen.
func (p *probeWatch) Sending([]etcdscan.Put) (func(etcdscan.Outcome), error) {
	if err := p.stopped(); err != nil {
		return nil, err
	}
	return func(etcdscan.Outcome) {}, nil
}
