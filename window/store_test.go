package window

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/leapgate/leapgate/internal/testclock"
)

func TestStoreDo(t *testing.T) {
	sec := mustSpec(t, time.Second, 10)
	minute := mustSpec(t, time.Minute, 60)
	type step struct {
		reqs    []Request
		allowed []bool
		recs    []bool
	}
	tests := []struct {
		name   string
		steps  []step
		counts map[string]uint64 // expected counts at the end
	}{
		{
			name: "veto refusal records nothing",
			steps: []step{
				{[]Request{{Key: "a", Spec: sec, Limit: 5, Hits: 4}}, []bool{true}, []bool{true}},
				{[]Request{
					{Key: "b", Spec: sec, Limit: 5, Hits: 1, Veto: true},
					{Key: "a", Spec: sec, Limit: 5, Hits: 2, Veto: true},
					{Key: "c", Spec: minute, Limit: 5, Hits: 1, Veto: true},
				}, []bool{true, false, true}, []bool{false, false, false}},
			},
			counts: map[string]uint64{"a": 4, "b": 0, "c": 0},
		},
		{
			name: "non-veto refusal (shadow) does not cancel the others",
			steps: []step{
				{[]Request{{Key: "a", Spec: sec, Limit: 1, Hits: 1}}, []bool{true}, []bool{true}},
				{[]Request{
					{Key: "a", Spec: sec, Limit: 1, Hits: 1, Veto: false},
					{Key: "b", Spec: sec, Limit: 5, Hits: 2, Veto: true},
				}, []bool{false, true}, []bool{false, true}},
			},
			counts: map[string]uint64{"a": 1, "b": 2},
		},
		{
			name: "same key twice in one batch",
			steps: []step{
				{[]Request{
					{Key: "a", Spec: sec, Limit: 3, Hits: 2, Veto: true},
					{Key: "a", Spec: sec, Limit: 3, Hits: 2, Veto: true},
				}, []bool{true, false}, []bool{false, false}},
				{[]Request{
					{Key: "a", Spec: sec, Limit: 3, Hits: 2, Veto: true},
					{Key: "a", Spec: sec, Limit: 3, Hits: 1, Veto: true},
				}, []bool{true, true}, []bool{true, true}},
			},
			counts: map[string]uint64{"a": 3},
		},
		{
			name: "check only counts nothing",
			steps: []step{
				{[]Request{{Key: "a", Spec: sec, Limit: 1, Hits: 0}}, []bool{true}, []bool{false}},
				{[]Request{{Key: "a", Spec: sec, Limit: 0, Hits: 0}}, []bool{false}, []bool{false}},
			},
			counts: map[string]uint64{"a": 0},
		},
		{
			name: "new spec replaces the counter",
			steps: []step{
				{[]Request{{Key: "a", Spec: sec, Limit: 2, Hits: 2}}, []bool{true}, []bool{true}},
				{[]Request{{Key: "a", Spec: minute, Limit: 2, Hits: 1}}, []bool{true}, []bool{true}},
			},
			counts: map[string]uint64{"a": 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := &testclock.Clock{}
			clock.Set(time.Hour)
			s := NewStore(StoreOptions{Clock: clock})
			for i, st := range tt.steps {
				res, err := s.Do(context.Background(), st.reqs)
				if err != nil {
					t.Fatal(err)
				}
				for j, r := range res {
					if r.Allowed != st.allowed[j] || r.Recorded != st.recs[j] {
						t.Fatalf("step %d request %d: %+v, want allowed %v recorded %v", i, j, r, st.allowed[j], st.recs[j])
					}
				}
			}
			for k, want := range tt.counts {
				if got := s.CountAt(k, clock.Now()); got != want {
					t.Fatalf("count of %q = %d, want %d", k, got, want)
				}
			}
		})
	}
}

func TestStoreVetoRestoresRemaining(t *testing.T) {
	sec := mustSpec(t, time.Second, 10)
	s := NewStore(StoreOptions{Clock: &testclock.Clock{}})
	res, _ := s.Do(context.Background(), []Request{
		{Key: "a", Spec: sec, Limit: 10, Hits: 3, Veto: true},
		{Key: "b", Spec: sec, Limit: 0, Hits: 1, Veto: true},
	})
	if res[0].Remaining != 10 {
		t.Fatalf("remaining of the undone request = %d, want 10", res[0].Remaining)
	}
}

func TestStoreErrors(t *testing.T) {
	s := NewStore(StoreOptions{Clock: &testclock.Clock{}})
	_, err := s.Do(context.Background(), []Request{{Key: "a", Limit: 1, Hits: 1}})
	if !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("zero Spec: error %v, want ErrInvalidSpec", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Do(ctx, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: error %v", err)
	}
	if got := s.Stats().Keys; got != 0 {
		t.Fatalf("failed requests created %d keys", got)
	}
}

func TestStoreUndo(t *testing.T) {
	sec := mustSpec(t, time.Second, 10)
	clock := &testclock.Clock{}
	s := NewStore(StoreOptions{Clock: clock})
	reqs := []Request{{Key: "a", Spec: sec, Limit: 10, Hits: 4}, {Key: "b", Spec: sec, Limit: 1, Hits: 2}}
	res, _ := s.Do(context.Background(), reqs)
	clock.Advance(300 * time.Millisecond)
	if err := s.Undo(context.Background(), reqs, res); err != nil {
		t.Fatal(err)
	}
	if got := s.CountAt("a", clock.Now()); got != 0 {
		t.Fatalf("count after undo = %d", got)
	}
}

// Many goroutines, many keys, one instant: every key admits exactly its
// limit through the Store.
func TestStoreAtomicAdmission(t *testing.T) {
	spec := mustSpec(t, time.Second, 20)
	s := NewStore(StoreOptions{Clock: &testclock.Clock{}})
	const keys, limit = 8, 200
	var admitted [keys]atomic.Uint64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results := make([]Result, 1)
			for i := range 1000 {
				k := (i + g) % keys
				req := []Request{{Key: fmt.Sprint("k", k), Spec: spec, Limit: limit, Hits: 1, Veto: true}}
				if err := s.DoAt(context.Background(), time.Minute, req, results); err != nil {
					t.Error(err)
					return
				}
				if results[0].Recorded {
					admitted[k].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	for k := range keys {
		if got := admitted[k].Load(); got != limit {
			t.Fatalf("key %d admitted %d, want exactly %d", k, got, limit)
		}
	}
}

// The Store copies keys: a Key aliasing a buffer the caller reuses
// (unsafe.String) is safe, on creation and on replacement.
func TestStoreDoesNotRetainKeys(t *testing.T) {
	sec := mustSpec(t, time.Second, 10)
	minute := mustSpec(t, time.Minute, 10)
	s := NewStore(StoreOptions{Clock: &testclock.Clock{}})
	buf := []byte("key-a")
	alias := unsafe.String(&buf[0], len(buf))
	for _, spec := range []Spec{sec, minute} { // create, then replace
		if _, err := s.Do(context.Background(), []Request{{Key: alias, Spec: spec, Limit: 5, Hits: 2}}); err != nil {
			t.Fatal(err)
		}
		copy(buf, "key-b")
		if got := s.CountAt("key-a", 0); got != 2 {
			t.Fatalf("count of key-a = %d after its buffer was reused, want 2", got)
		}
		copy(buf, "key-a")
	}
}

// TestResultUnrecord: an answer whose hits were taken back reads as if they
// had never been recorded, its remaining quota never above the limit.
func TestResultUnrecord(t *testing.T) {
	for _, tc := range []struct {
		remaining, hits, limit, want uint64
	}{
		{0, 3, 10, 3},
		{7, 3, 10, 10},
		{9, 3, 10, 10},                       // a refund in between left more room
		{MaxLimit - 1, 5, 1 << 40, MaxLimit}, // limits above MaxLimit are MaxLimit
	} {
		r := Result{Allowed: true, Recorded: true, Remaining: tc.remaining}
		r.Unrecord(&Request{Hits: tc.hits, Limit: tc.limit})
		if r.Recorded || !r.Allowed || r.Remaining != tc.want {
			t.Errorf("%+v: %+v, want unrecorded, allowed, remaining %d", tc, r, tc.want)
		}
	}
}

// TestRefundOfAnUnknownKey: a refund for a key without a counter (never
// used, or evicted) changes nothing and answers as a check of an empty
// window would: allowed with the whole limit left, or, under a limit of 0,
// refused with nothing left.
func TestRefundOfAnUnknownKey(t *testing.T) {
	sp, _ := NewSpec(time.Minute, 6)
	for _, limit := range []uint64{0, 1, 5} {
		s := NewStore(StoreOptions{Clock: testclock.At(time.Hour)})
		refund, err := s.Do(context.Background(), []Request{{Key: "new", Spec: sp, Limit: limit, Hits: 3, Negative: true}})
		if err != nil {
			t.Fatal(err)
		}
		check, err := s.Do(context.Background(), []Request{{Key: "other", Spec: sp, Limit: limit}})
		if err != nil {
			t.Fatal(err)
		}
		if refund[0] != check[0] || refund[0].Allowed != (limit > 0) || refund[0].Remaining != limit {
			t.Errorf("limit %d: refund %+v, a check of an empty window %+v", limit, refund[0], check[0])
		}
	}
}

// TestEvictionPrefersIdleKeys: at MaxKeys, a new key evicts a key whose
// window has passed (idle, however recently it was used) before the least
// recently used key whose window still holds hits.
func TestEvictionPrefersIdleKeys(t *testing.T) {
	ctx := context.Background()
	s := NewStore(StoreOptions{Clock: &testclock.Clock{}, MaxKeys: 2})
	second, hour := mustSpec(t, time.Second, 1), mustSpec(t, time.Hour, 1)
	do := func(at time.Duration, req Request) Result {
		t.Helper()
		res := make([]Result, 1)
		if err := s.DoAt(ctx, at, []Request{req}, res); err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	do(5*time.Second, Request{Key: "old", Spec: hour, Limit: 10, Hits: 1})     // least recently used, still counting
	do(10*time.Second, Request{Key: "idle", Spec: second, Limit: 10, Hits: 1}) // its window passes at 11 s
	do(20*time.Second, Request{Key: "new", Spec: second, Limit: 10, Hits: 1})
	if st := s.Stats(); st.Keys != 2 || st.Evictions != 1 {
		t.Fatalf("%+v, want 2 keys after 1 eviction", st)
	}
	if r := do(20*time.Second, Request{Key: "old", Spec: hour, Limit: 10}); r.Remaining != 9 {
		t.Errorf("the least recently used key lost its hit (remaining %d): the idle key should have gone", r.Remaining)
	}
}
