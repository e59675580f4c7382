package rlqssim

import (
	"math"
	"slices"
	"time"
)

// score scores the run.
func (s *sim) score() Result {
	sc := s.scenario
	steps := len(s.admitted[0])
	w := int(sc.Window / Step)
	total := make([]float64, steps+1) // prefix sums of admitted
	offered := make([]float64, steps+1)
	for k := 0; k < steps; k++ {
		a, o := 0.0, 0.0
		t := time.Duration(k) * Step
		for i := range s.filters {
			a += float64(s.admitted[i][k])
			o += s.filters[i].client.offered(t) * Step.Seconds()
		}
		total[k+1], offered[k+1] = total[k]+a, offered[k]+o
	}
	sum := func(p []float64, from, to int) float64 { return p[max(to, 0)] - p[max(from, 0)] } // steps [from, to)

	warmup := sc.Warmup
	var events []time.Duration // start, joins, restarts: the peak bound waits a warm-up after them
	var changes []time.Duration
	for i := range sc.Clients {
		c := &sc.Clients[i]
		warmup = max(warmup, c.Report+time.Second)
		for j, p := range c.Load {
			if j == 0 {
				events = append(events, p.At)
			}
			changes = append(changes, p.At)
		}
		if c.Leave > 0 {
			changes = append(changes, c.Leave)
		}
	}
	events = append(events, sc.Restarts...)
	changes = append(changes, sc.Restarts...)
	settled := func(from, to time.Duration) bool {
		for _, e := range events {
			if to >= e && from < e+warmup {
				return false
			}
		}
		return true
	}

	r := Result{Scenario: sc.Name, Errors: s.errors}
	usedNum, usedDen := 0.0, 0.0
	for end := 1; end <= steps; end++ {
		v := sum(total, end-w, end) / sc.Limit
		r.Peak = math.Max(r.Peak, v)
		from, to := time.Duration(end-w)*Step, time.Duration(end)*Step
		if settled(from, to) {
			r.PeakSettled = math.Max(r.PeakSettled, v)
			if end%w == 0 && end >= w {
				usedNum += sum(total, end-w, end)
				usedDen += math.Min(sum(offered, end-w, end), sc.Limit)
			}
		}
	}
	if usedDen > 0 {
		r.Used = usedNum / usedDen
	}

	rate := sc.Limit / sc.Window.Seconds()
	span := max(int(5*time.Second/Step), w)
	r.Rates, r.Targets = s.rates(steps, span), s.targets(time.Duration(steps-1)*Step, rate)
	r.FairnessError = l1(r.Rates, r.Targets) / rate
	admitted, possible := 0.0, 0.0
	for i := range r.Rates {
		admitted += r.Rates[i]
		possible += s.filters[i].client.offered(time.Duration(steps-1) * Step)
	}
	if possible = math.Min(possible, rate); possible > 0 {
		r.UsedLast = admitted / possible
	}

	slices.Sort(changes)
	changes = slices.Compact(changes)
	span = w
	for j, e := range changes {
		if e <= 0 {
			continue
		}
		next := sc.Duration
		if j+1 < len(changes) {
			next = changes[j+1]
		}
		converged := time.Duration(-1)
		for t := next - Step; t >= e; t -= 100 * time.Millisecond {
			k := int(t / Step)
			if l1(s.rates(k+1, span), s.targets(t, rate))/rate > 0.05 {
				break
			}
			converged = t - e
		}
		r.Converged = append(r.Converged, converged)
	}
	return r
}

// rates returns each client's admitted rate over the span steps before end.
func (s *sim) rates(end, span int) []float64 {
	out := make([]float64, len(s.filters))
	from := max(end-span, 0)
	for i := range s.filters {
		n := 0
		for k := from; k < end; k++ {
			n += int(s.admitted[i][k])
		}
		out[i] = float64(n) / (time.Duration(end-from) * Step).Seconds()
	}
	return out
}

// targets returns the clients' max-min fair shares of rate by their offered
// load at t.
func (s *sim) targets(t time.Duration, rate float64) []float64 {
	offered := make([]float64, len(s.filters))
	for i, f := range s.filters {
		offered[i] = f.client.offered(t)
	}
	return fairShares(rate, offered)
}

func l1(a, b []float64) float64 {
	d := 0.0
	for i := range a {
		d += math.Abs(a[i] - b[i])
	}
	return d
}
