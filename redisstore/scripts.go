package redisstore

import (
	"context"
	"crypto/sha1"
	"embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/leapgate/leapgate/window"
)

// luaFiles is the scripts' code: common.lua, checkpoint.lua, one file per
// algorithm of window.Algorithms named after it, and batch.lua.
//
//go:embed lua/*.lua
var luaFiles embed.FS

// The scripts are one body of code (see code) with an entry point each:
// allow, the admission of a batch, and undo (Limiter.Undo). The code also
// becomes a Redis function library (Redis 7) registering both, named by a
// digest of its code so that versions never collide: loaded once per node,
// its helpers are defined once instead of on every call (see
// redisstore/clientbench for what that saves).
var (
	allowEval   = code(false) + "\nreturn allow(KEYS, ARGV)\n"
	allowScript = redis.NewScript(allowEval)
	undoScript  = redis.NewScript(code(false) + "\nreturn undo(KEYS, ARGV)\n")
	libVersion  = fmt.Sprintf("%x", sha1.Sum([]byte(code(true))))[:16]
	// allowFunction and undoFunction are the functions allowLibrary
	// registers.
	allowFunction = "leapgate_allow_" + libVersion
	undoFunction  = "leapgate_undo_" + libVersion
	allowLibrary  = "#!lua name=leapgate_" + libVersion + "\n" + code(true) +
		"\nredis.register_function('" + allowFunction + "', allow)\n" +
		"redis.register_function('" + undoFunction + "', undo)\n"
)

// Scripts returns the admission code as the Store runs it: the EVAL script,
// the Redis 7 function library, and the name of the library's admission
// function (FCALL it with the EVAL script's KEYS and ARGV). It is for tools
// that measure the scripts (redisstore/clientbench); the Store loads and
// calls them itself.
func Scripts() (eval, library, function string) {
	return allowEval, allowLibrary, allowFunction
}

// code is the scripts' code: the constants the Go side owns (window's
// counter layout and the algorithm table: each algorithm's number as
// ALG_<NAME>, CHARGEABLE and HOLDS as sets of them), then common.lua,
// checkpoint.lua, lua/<name>.lua for every algorithm, and batch.lua;
// library says whether it is for a function library rather than EVAL.
func code(library bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "local BLOCKS, EXACT, MAX_LIMIT, CP_TICKS, LIBRARY = %d, %d, %d, %d, %t\n",
		window.Blocks, window.ExactLimit, uint64(window.MaxLimit), window.TicksPerWindow, library)
	var chargeable, holds []string
	for _, a := range window.Algorithms() {
		fmt.Fprintf(&b, "local %s = %d\n", luaName(a), a)
		if a.Info().ChargeAlways {
			chargeable = append(chargeable, "["+luaName(a)+"] = true")
		}
		if a.Info().Holders {
			holds = append(holds, "["+luaName(a)+"] = true")
		}
	}
	fmt.Fprintf(&b, "local CHARGEABLE = {%s}\nlocal HOLDS = {%s}\n", strings.Join(chargeable, ", "), strings.Join(holds, ", "))
	b.WriteString(luaFile("common"))
	b.WriteString(luaFile("checkpoint"))
	for _, a := range window.Algorithms() {
		b.WriteString(luaFile(a.String()))
	}
	b.WriteString(luaFile("batch"))
	return b.String()
}

// luaName is the name of a's number in the scripts: ALG_ and its name in
// capitals (ALG_SLIDING_WINDOW).
func luaName(a window.Algorithm) string { return "ALG_" + strings.ToUpper(a.String()) }

// luaFile returns lua/<name>.lua; every algorithm has one
// (TestEveryAlgorithmHasItsScript).
func luaFile(name string) string {
	b, err := luaFiles.ReadFile("lua/" + name + ".lua")
	if err != nil {
		panic("redisstore: " + err.Error())
	}
	return string(b)
}

// CheckRequest returns nil if a Store serves req, and otherwise why not:
// what window.CheckRequest refuses, and a bucket length that is not a whole
// number of microseconds (the scripts work in microseconds, Redis's TIME
// resolution), which only a time_buckets limit with many buckets can have.
// It needs no Redis: `check-config` checks rules with it offline.
func CheckRequest(req *window.Request) error {
	if err := window.CheckRequest(req); err != nil {
		return err
	}
	if req.Spec.BucketLength()%time.Microsecond != 0 {
		return fmt.Errorf("bucket length %v: %w", req.Spec.BucketLength(), ErrBucketLength)
	}
	return nil
}

// ErrBucketLength is returned (wrapped) by CheckRequest for a Spec whose
// bucket length is not a whole number of microseconds.
var ErrBucketLength = errors.New("the Redis backend needs bucket lengths in whole microseconds")

// counterKey returns the Redis key of req's counter: its hash tag is the
// whole Request.Key, so the slot depends on the key alone and is the same
// for every algorithm, and the algorithm's key suffix
// (window.AlgorithmInfo.KeySuffix) ends it, so that a key never meets a
// layout it was not written with.
func (s *Store) counterKey(req *window.Request) string {
	return s.prefix + "{" + req.Key + "}" + req.Algorithm.Info().KeySuffix // one allocation
}

// timeBucket converts the Result.Bucket of a sliding window or a sliding
// log (a time in ns, as in window.Counter and window.LogCounter) to and from
// the script's microseconds.
const timeBucket = int64(time.Microsecond)

// bucketIsTime reports whether a's Result.Bucket is a time (see timeBucket).
func bucketIsTime(a window.Algorithm) bool { return a.Info().BucketIsTime }

// flag renders a bool as a script argument.
func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// nowArg is the script's time argument: "" (Redis's TIME) unless a test
// injected a time.
func (s *Store) nowArg() string {
	if s.nowMicros != nil {
		return strconv.FormatInt(s.nowMicros(), 10)
	}
	return ""
}

// group is the requests of one script call (one hash slot on Cluster).
type group struct {
	slot uint16
	idx  []int // indexes into reqs
}

// groups splits idx by hash slot on Cluster; elsewhere it is one group.
func (s *Store) groups(keys []string, idx []int) []group {
	if !s.cluster {
		return []group{{idx: idx}}
	}
	var gs []group
next:
	for _, i := range idx {
		slot := keySlot(keys[i])
		for g := range gs {
			if gs[g].slot == slot {
				gs[g].idx = append(gs[g].idx, i)
				continue next
			}
		}
		gs = append(gs, group{slot: slot, idx: []int{i}})
	}
	return gs
}

// allow runs the admission script for reqs[send], writing results, in one
// round trip (keys, if not nil, are the requests' counter keys, already
// built). The one exception is a Cluster batch spanning several slots with
// both a Veto request and a refund: refunds must not apply if a Veto in
// another slot refuses, so they are checked in the first round trip and
// applied in a second one only if nothing was vetoed.
func (s *Store) allow(ctx context.Context, reqs []window.Request, results []window.Result, keys []string, send []int, dry bool) error {
	if keys == nil {
		keys = make([]string, len(reqs))
		for _, i := range send {
			keys[i] = s.counterKey(&reqs[i])
		}
	}
	gs := s.groups(keys, send)
	var refunds []int
	if len(gs) > 1 && !dry {
		veto := false
		for _, i := range send {
			veto = veto || reqs[i].Veto && !reqs[i].Negative
			if reqs[i].Negative {
				refunds = append(refunds, i)
			}
		}
		if !veto {
			refunds = nil
		}
	}
	first := reqs
	if len(refunds) > 0 {
		// Phase one: every refund is a check.
		first = make([]window.Request, len(reqs))
		copy(first, reqs)
		for _, i := range refunds {
			first[i].Negative, first[i].Hits, first[i].Veto = false, 0, false
		}
	}
	vetoed, err := s.runAllow(ctx, first, results, keys, gs, dry)
	if err != nil {
		return err
	}
	if vetoed && len(gs) > 1 {
		return s.takeBack(ctx, reqs, results, send)
	}
	if len(refunds) > 0 {
		_, err = s.runAllow(ctx, reqs, results, keys, s.groups(keys, refunds), false)
	}
	return err
}

// runAllow sends one allow group per slot group (merged by the pipeliner
// with the groups of concurrent calls), writes the results and reports
// whether a Veto request was refused. Its job, calls and arguments live in
// a frame reused across calls.
func (s *Store) runAllow(ctx context.Context, reqs []window.Request, results []window.Result, keys []string, gs []group, dry bool) (bool, error) {
	f := s.frames.Get().(*frame)
	f.reset()
	for _, gr := range gs {
		k0, p0, a0 := len(f.keys), len(f.packed), len(f.args)
		for _, i := range gr.idx {
			f.keys = append(f.keys, keys[i])
			f.packed = packArgs(f.packed, &reqs[i])
		}
		// Sub-slices taken before a later append grows these buffers keep
		// pointing at the old arrays, which still hold their contents.
		f.args = append(f.args, len(gr.idx), flag(dry), f.packed[p0:len(f.packed):len(f.packed)])
		f.calls = append(f.calls, call{slot: gr.slot, keys: f.keys[k0:len(f.keys):len(f.keys)], args: f.args[a0:len(f.args):len(f.args)]})
	}
	f.job = job{script: allowScript, calls: f.calls, merged: true, now: s.nowArg(), done: f.job.done}
	answered, err := s.timed(ctx, "do", &f.job)
	if answered {
		// The pipeliner is done with the frame once it answered; a frame
		// whose caller gave up first is left to the garbage collector.
		defer s.frames.Put(f)
	}
	if err != nil {
		return false, err
	}

	vetoed := false
	for g, gr := range gs {
		vals := f.calls[g].vals
		if len(vals) != 5*len(gr.idx) {
			return false, fmt.Errorf("unexpected script reply: %d values for %d counters", len(vals), len(gr.idx))
		}
		for j, i := range gr.idx {
			v := vals[5*j : 5*j+5]
			results[i] = window.Result{
				Allowed:   v[0] == 1,
				Recorded:  v[1] == 1,
				Remaining: uint64(v[2]),
				Reset:     time.Duration(v[3]), // ns
				Bucket:    v[4],
			}
			if bucketIsTime(reqs[i].Algorithm) {
				results[i].Bucket *= timeBucket
			}
			if reqs[i].Veto && !reqs[i].Negative && !results[i].Allowed {
				vetoed = true
			}
		}
	}
	return vetoed, nil
}

// frame is the memory of one runAllow: its job (with a reusable done
// channel), the calls and their keys and arguments.
type frame struct {
	job    job
	calls  []call
	keys   []string
	packed []byte
	args   []any
}

// newFrame is the Store's frame pool's New.
func newFrame() any { return &frame{job: job{done: make(chan error, 1)}} }

// reset empties f's buffers, keeping their room.
func (f *frame) reset() {
	clear(f.calls)
	clear(f.keys)
	clear(f.args)
	f.calls, f.keys, f.packed, f.args = f.calls[:0], f.keys[:0], f.packed[:0], f.args[:0]
}

// packArgs appends the allow script's arguments for r (see lua/batch.lua):
// four doubles and three bytes (struct.pack('<ddddBBB')), the last a flag
// byte: 1 for a refund (Negative), 2 for ChargeAlways; an algorithm with
// holders has one more double, the holder. The doubles are exact: every
// value is below 2^53.
func packArgs(dst []byte, r *window.Request) []byte {
	for _, v := range []uint64{
		uint64(r.Spec.BucketLength() / time.Microsecond),
		uint64(r.Spec.Buckets()),
		min(r.Limit, window.MaxLimit),
		min(r.Hits, window.MaxLimit+1), // beyond the limit either way
	} {
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(float64(v)))
	}
	dst = append(dst, boolByte(r.Veto), byte(r.Algorithm), boolByte(r.Negative)|boolByte(r.ChargeAlways)<<1)
	if r.Algorithm.Info().Holders {
		// One more double: the holder (window.HolderID, 48 bits: exact).
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(float64(window.HolderID(r.Holder))))
	}
	return dst
}

// leaseField is the field of a concurrency counter's hash that holds the
// slots req recorded at bucket (a time in microseconds): its holder's, or
// the one of slots held by nobody leased at that time (see lua/concurrency.lua).
func leaseField(req *window.Request, bucket int64) string {
	if id := window.HolderID(req.Holder); id != 0 {
		return "h" + strconv.FormatUint(id, 10)
	}
	return "~" + strconv.FormatInt(bucket, 10)
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// takeBack undoes the hits that slots other than a refusing Veto's recorded
// (Cluster only: a script cannot span slots).
func (s *Store) takeBack(ctx context.Context, reqs []window.Request, results []window.Result, send []int) error {
	var undo []int
	for _, i := range send {
		if results[i].Recorded && !reqs[i].ChargeAlways {
			undo = append(undo, i)
		}
	}
	if len(undo) == 0 {
		return nil
	}
	if err := s.undo(ctx, reqs, results, undo); err != nil {
		return fmt.Errorf("taking back hits of a vetoed batch: %w", err)
	}
	for _, i := range undo {
		r := &results[i]
		r.Unrecord(&reqs[i])
	}
	return nil
}

// undo runs the undo script for reqs[idx].
func (s *Store) undo(ctx context.Context, reqs []window.Request, results []window.Result, idx []int) error {
	keys := make([]string, len(reqs))
	for _, i := range idx {
		keys[i] = s.counterKey(&reqs[i])
	}
	gs := s.groups(keys, idx)
	now := s.nowArg()
	calls := make([]call, len(gs))
	for g, gr := range gs {
		c := &calls[g]
		c.keys = make([]string, len(gr.idx))
		c.args = make([]any, 1, 1+6*len(gr.idx))
		c.args[0] = now
		for j, i := range gr.idx {
			r := &reqs[i]
			c.keys[j] = keys[i]
			bucket := results[i].Bucket
			if bucketIsTime(r.Algorithm) {
				bucket /= timeBucket
			}
			var field any = bucket
			if r.Algorithm.Info().Holders {
				field = leaseField(r, bucket)
			}
			c.args = append(c.args, int(r.Algorithm), field, min(r.Hits, window.MaxLimit),
				min(r.Limit, window.MaxLimit), int64(r.Spec.BucketLength()/time.Microsecond), r.Spec.Buckets())
		}
	}
	_, err := s.timed(ctx, "undo", &job{script: undoScript, function: undoFunction, calls: calls})
	return err
}

// call is one script invocation, or for the allow script one group of
// one (see lua/batch.lua), which the pipeliner merges with others.
type call struct {
	keys []string
	args []any
	slot uint16     // the hash slot of keys (Cluster)
	cmd  *redis.Cmd // the reply of an unmerged call
	vals []int64    // the reply of a merged call: 5 integers per key
}

// timed sends j through the pipeliner, one operation of len(j.calls)
// script calls, in a span "redis <op>" (a child of ctx's span, when tracing
// is on), and records its latency and failure. It reports whether the
// pipeliner answered j (see pipeliner.do).
func (s *Store) timed(ctx context.Context, op string, j *job) (answered bool, err error) {
	var span trace.Span
	if s.tracer != nil { // nothing is built for spans when tracing is off
		ctx, span = s.tracer.Start(ctx, "redis "+op, trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.String("db.system.name", "redis"), attribute.Int("leapgate.redis.calls", len(j.calls))))
		defer span.End()
	}
	start := time.Now()
	answered, err = s.pipe.do(ctx, j)
	m := s.metrics.op(op)
	m.latency.Observe(time.Since(start).Seconds())
	if err != nil {
		m.errors.Inc()
		if span != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, "redis call failed")
		}
	}
	return answered, err
}
