package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// pipelineWorkers is how many pipelines may be in flight at once (each on
// its own pooled connection): one waits for Redis while the next fills, and
// Redis runs them one after another anyway (see docs/redis.md).
const pipelineWorkers = 2

// maxBatchCalls bounds the calls one round trip carries, so that one
// pipeline never grows without bound under a burst.
const maxBatchCalls = 256

// pipeliner coalesces the script calls of concurrent Do and Undo calls into
// one round trip: each of its workers takes every job waiting at that
// moment and sends them in one pipeline, in which the allow groups of all
// jobs become one script call per hash slot (one call on a single node).
// When idle, a job is sent at once (a worker is waiting for it), so
// batching adds no latency; under concurrency, n callers cost a few round
// trips and script calls instead of n. Each of the pipelineWorkers workers
// holds at most one pooled connection at a time.
type pipeliner struct {
	client  redis.UniversalClient
	timeout time.Duration
	queue   chan *job
	batch   prometheus.Observer // operations per round trip
	// functions is whether allowLibrary is loaded on every node, so that
	// merged allow calls are FCALLs (see Store.loadFunctions); without it
	// they are EVALSHAs.
	functions atomic.Bool
	// reload is set when a node answered that the function is missing (a
	// node added, FUNCTION FLUSH): the next health check loads it again.
	reload atomic.Bool
	// refused records that Redis refused the function library: FCALL is
	// not tried again.
	refused atomic.Bool
}

// job is the calls of one Store operation. A merged job's calls are allow
// groups, sent with the groups of other merged jobs under now (the time
// argument: "" for Redis's TIME). done receives the first error among the
// job's calls, or nil.
type job struct {
	script *redis.Script
	// function, when set, is script's function in the library: an
	// unmerged call is an FCALL of it while the library is loaded.
	function string
	calls    []call
	merged   bool
	now      string
	// deadline is when the job's caller stops waiting: a job still queued
	// then is answered with context.DeadlineExceeded unsent, and a round
	// trip carrying it ends by then (see do).
	deadline time.Time
	done     chan error
}

// newPipeliner starts workers workers that run until ctx is done.
func newPipeliner(ctx context.Context, client redis.UniversalClient, workers int, timeout time.Duration, batch prometheus.Observer) *pipeliner {
	p := &pipeliner{client: client, timeout: timeout, queue: make(chan *job, 4*maxBatchCalls), batch: batch}
	for range workers {
		go p.work(ctx)
	}
	return p
}

// do sends j and waits for its replies, or for ctx to be done. It returns
// by ctx's deadline (or p's timeout from now, if ctx has none) without a
// timer of its own: the workers answer a job by its deadline, a job still
// queued then unsent, and every round trip ends by the earliest deadline of
// the jobs it carries; only a full queue makes do wait on a timer. A call
// whose caller gave up may still run: like any Redis command that timed
// out, its effect is unknown.
//
// It reports whether j was answered: only then is the pipeliner done with
// j and its calls (a caller that gave up first must not reuse them). j.done,
// if set, must be an empty channel with room for one error.
func (p *pipeliner) do(ctx context.Context, j *job) (answered bool, err error) {
	if j.done == nil {
		j.done = make(chan error, 1)
	}
	if d, ok := ctx.Deadline(); ok {
		j.deadline = d
	} else {
		j.deadline = time.Now().Add(p.timeout)
	}
	select {
	case p.queue <- j:
	case <-ctx.Done():
		return true, ctx.Err() // never queued
	default:
		t := time.NewTimer(time.Until(j.deadline))
		defer t.Stop()
		select {
		case p.queue <- j:
		case <-ctx.Done():
			return true, ctx.Err()
		case <-t.C:
			return true, context.DeadlineExceeded
		}
	}
	select {
	case err := <-j.done:
		return true, err
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

func (p *pipeliner) work(ctx context.Context) {
	batch := make([]*job, 0, 64)
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-p.queue:
			batch = append(batch[:0], j)
		}
		n := len(batch[0].calls)
	drain:
		for n < maxBatchCalls {
			select {
			case j := <-p.queue:
				batch = append(batch, j)
				n += len(j.calls)
			default:
				break drain
			}
		}
		// Jobs whose callers stop waiting now are answered unsent.
		now := time.Now()
		live := batch[:0]
		for _, j := range batch {
			if now.Before(j.deadline) {
				live = append(live, j)
			} else {
				j.done <- context.DeadlineExceeded
			}
		}
		if len(live) > 0 {
			p.batch.Observe(float64(len(live)))
			p.flush(live)
		}
		clear(batch)
	}
}

// segment is one call's part of a merged script call.
type segment struct {
	job  int
	call int
}

// merged is one script call made of the allow groups of several calls.
type merged struct {
	slot uint16
	now  string
	keys []string
	args []any
	segs []segment
	cmd  *redis.Cmd
}

// flush sends batch in one pipeline, ending by the earliest deadline of its
// jobs, and answers every job. Merged allow calls are FCALLs when the
// function library is loaded, else EVALSHAs. Scripts missing from Redis's
// cache (NOSCRIPT: a restarted Redis or SCRIPT FLUSH), and a function a
// node does not have, are sent again with EVAL; nothing ran in that case,
// so this is safe.
func (p *pipeliner) flush(batch []*job) {
	deadline := time.Now().Add(p.timeout)
	for _, j := range batch {
		if j.deadline.Before(deadline) {
			deadline = j.deadline
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	errs := make([]error, len(batch))

	// The allow groups, merged per slot and time argument.
	var ms []*merged
	for ji, j := range batch {
		if !j.merged {
			continue
		}
	calls:
		for ci := range j.calls {
			c := &j.calls[ci]
			for _, m := range ms {
				if m.now == j.now && m.slot == c.slot {
					m.keys = append(m.keys, c.keys...)
					m.args = append(m.args, c.args...)
					m.segs = append(m.segs, segment{ji, ci})
					continue calls
				}
			}
			m := &merged{slot: c.slot, now: j.now, keys: append([]string(nil), c.keys...), segs: []segment{{ji, ci}}}
			m.args = append([]any{j.now}, c.args...)
			ms = append(ms, m)
		}
	}

	send := func(pipe redis.Pipeliner, eval bool, script *redis.Script, keys []string, args []any) *redis.Cmd {
		if eval {
			return script.Eval(ctx, pipe, keys, args...)
		}
		return script.EvalSha(ctx, pipe, keys, args...)
	}
	pipe := p.client.Pipeline()
	fcall := p.functions.Load()
	for _, m := range ms {
		if fcall {
			m.cmd = pipe.FCall(ctx, allowFunction, m.keys, m.args...)
		} else {
			m.cmd = send(pipe, false, allowScript, m.keys, m.args)
		}
	}
	for _, j := range batch {
		if j.merged {
			continue
		}
		for ci := range j.calls {
			c := &j.calls[ci]
			if fcall && j.function != "" {
				c.cmd = pipe.FCall(ctx, j.function, c.keys, c.args...)
			} else {
				c.cmd = send(pipe, false, j.script, c.keys, c.args)
			}
		}
	}
	_, _ = pipe.Exec(ctx)

	// NOSCRIPT, or a node without the function: send those again, in
	// full (nothing ran).
	noScript := func(cmd *redis.Cmd) bool {
		err := cmd.Err()
		if err != nil && strings.HasPrefix(err.Error(), "ERR Function not found") {
			p.reload.Store(true)
			return true
		}
		return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
	}
	var retry redis.Pipeliner
	again := func() redis.Pipeliner {
		if retry == nil {
			retry = p.client.Pipeline()
		}
		return retry
	}
	for _, m := range ms {
		if noScript(m.cmd) {
			m.cmd = send(again(), true, allowScript, m.keys, m.args)
		}
	}
	for _, j := range batch {
		if j.merged {
			continue
		}
		for ci := range j.calls {
			if c := &j.calls[ci]; noScript(c.cmd) {
				c.cmd = send(again(), true, j.script, c.keys, c.args)
			}
		}
	}
	if retry != nil {
		_, _ = retry.Exec(ctx)
	}

	// Replies.
	for _, m := range ms {
		vals, err := m.cmd.Int64Slice()
		if err == nil && len(vals) != 5*len(m.keys) {
			err = fmt.Errorf("allow script returned %d values for %d keys", len(vals), len(m.keys))
		}
		off := 0
		for _, sg := range m.segs {
			c := &batch[sg.job].calls[sg.call]
			if err != nil {
				if errs[sg.job] == nil {
					errs[sg.job] = err
				}
				continue
			}
			c.vals = vals[off : off+5*len(c.keys) : off+5*len(c.keys)]
			off += 5 * len(c.keys)
		}
	}
	for ji, j := range batch {
		if !j.merged {
			for ci := range j.calls {
				if err := j.calls[ci].cmd.Err(); err != nil && errs[ji] == nil {
					errs[ji] = err
				}
			}
		}
		j.done <- errs[ji]
	}
}
