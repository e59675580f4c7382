package window

import (
	"context"
	"errors"
	"slices"
	"time"
)

// Split is a Limiter made of two: the requests of windows of at most
// MaxShort go to Short, the others to Long (REDIS_PERSECOND sends windows of
// a second or less to a Redis of their own). Do keeps the Limiter contract
// across the two: when a vetoing request is refused by either, the hits the
// other recorded are taken back, so the batch records nothing.
type Split struct {
	Short, Long Limiter
	// MaxShort is the longest window Short serves.
	MaxShort time.Duration
}

func (l Split) route(r *Request) bool { return r.Spec.Length() <= l.MaxShort }

// Do answers reqs from the two limiters, at once when the batch needs both.
// As the Redis store does across Cluster slots, refunds are first only
// checked, and applied once no vetoing request was refused.
func (l Split) Do(ctx context.Context, reqs []Request) ([]Result, error) {
	var refunds []int
	veto := false
	for i := range reqs {
		veto = veto || reqs[i].Veto && !reqs[i].Negative
		if reqs[i].Negative {
			refunds = append(refunds, i)
		}
	}
	if !veto || len(refunds) == 0 {
		res, _, err := l.split(ctx, reqs)
		return res, err
	}
	first := slices.Clone(reqs)
	for _, i := range refunds {
		first[i].Negative, first[i].Hits, first[i].Veto = false, 0, false
	}
	res, vetoed, err := l.split(ctx, first)
	if err != nil || vetoed {
		return res, err
	}
	second := make([]Request, len(refunds))
	for j, i := range refunds {
		second[j] = reqs[i]
	}
	refunded, _, err := l.split(ctx, second)
	if err != nil {
		return nil, err
	}
	for j, i := range refunds {
		res[i] = refunded[j]
	}
	return res, nil
}

// split answers reqs from the two limiters and reports whether a vetoing
// request was refused, in which case nothing is left recorded.
func (l Split) split(ctx context.Context, reqs []Request) ([]Result, bool, error) {
	var short, long []Request
	var shortAt, longAt []int
	for i := range reqs {
		if l.route(&reqs[i]) {
			short, shortAt = append(short, reqs[i]), append(shortAt, i)
		} else {
			long, longAt = append(long, reqs[i]), append(longAt, i)
		}
	}
	switch {
	case len(short) == 0:
		res, err := l.Long.Do(ctx, reqs)
		return res, err == nil && vetoedIn(reqs, res), err
	case len(long) == 0:
		res, err := l.Short.Do(ctx, reqs)
		return res, err == nil && vetoedIn(reqs, res), err
	}
	var shortRes []Result
	var shortErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		shortRes, shortErr = l.Short.Do(ctx, short)
	}()
	longRes, longErr := l.Long.Do(ctx, long)
	<-done

	parts := []struct {
		lim  Limiter
		reqs []Request
		res  []Result
		err  error
	}{{l.Short, short, shortRes, shortErr}, {l.Long, long, longRes, longErr}}
	failed := shortErr != nil || longErr != nil
	vetoed := !failed && (vetoedIn(short, shortRes) || vetoedIn(long, longRes))
	if failed || vetoed {
		// Take back what the other part recorded.
		var errs []error
		for _, p := range parts {
			if p.err != nil {
				errs = append(errs, p.err)
				continue
			}
			var undoReqs []Request
			var undoRes []Result
			for i := range p.res {
				if p.res[i].Recorded {
					undoReqs, undoRes = append(undoReqs, p.reqs[i]), append(undoRes, p.res[i])
					p.res[i].Unrecord(&p.reqs[i])
				}
			}
			if len(undoReqs) > 0 {
				if err := p.lim.Undo(ctx, undoReqs, undoRes); err != nil {
					errs = append(errs, err)
				}
			}
		}
		if failed || len(errs) > 0 {
			return nil, false, errors.Join(errs...)
		}
	}
	out := make([]Result, len(reqs))
	for i, at := range shortAt {
		out[at] = shortRes[i]
	}
	for i, at := range longAt {
		out[at] = longRes[i]
	}
	return out, vetoed, nil
}

// vetoedIn reports whether a vetoing request of reqs was refused.
func vetoedIn(reqs []Request, res []Result) bool {
	for i := range res {
		if reqs[i].Veto && !reqs[i].Negative && !res[i].Allowed {
			return true
		}
	}
	return false
}

// Undo takes back hits from the limiter that recorded them.
func (l Split) Undo(ctx context.Context, reqs []Request, results []Result) error {
	var short, long []Request
	var shortRes, longRes []Result
	for i := range reqs {
		if l.route(&reqs[i]) {
			short, shortRes = append(short, reqs[i]), append(shortRes, results[i])
		} else {
			long, longRes = append(long, reqs[i]), append(longRes, results[i])
		}
	}
	var errs []error
	if len(short) > 0 {
		errs = append(errs, l.Short.Undo(ctx, short, shortRes))
	}
	if len(long) > 0 {
		errs = append(errs, l.Long.Undo(ctx, long, longRes))
	}
	return errors.Join(errs...)
}

// CheckRequest returns the check of the limiter that would serve req
// (see RequestChecker).
func (l Split) CheckRequest(req *Request) error {
	if l.route(req) {
		return CheckerOf(l.Short).CheckRequest(req)
	}
	return CheckerOf(l.Long).CheckRequest(req)
}
