package breaker

import (
	"strconv"
	"testing"
)

func TestDedupe(t *testing.T) {
	type report struct {
		id, source string
		dup        bool
	}
	tests := []struct {
		name    string
		reports []report
	}{
		{"ext_proc then the access log", []report{{"a", SourceExtProc, false}, {"a", SourceALS, true}}},
		{"the access log then ext_proc", []report{{"a", SourceALS, false}, {"a", SourceExtProc, true}}},
		{"in-flight and final ext_proc are one feed", []report{{"a", SourceExtProcInFlight, false}, {"a", SourceExtProc, false}, {"a", SourceALS, true}}},
		{"a reused ID pairs anew", []report{{"a", SourceExtProc, false}, {"a", SourceALS, true}, {"a", SourceExtProc, false}, {"a", SourceALS, true}}},
		{"one feed alone never drops", []report{{"a", SourceALS, false}, {"a", SourceALS, false}}},
		{"no ID", []report{{"", SourceExtProc, false}, {"", SourceALS, false}}},
		{"reports carry no ID", []report{{"a", SourceExtProc, false}, {"a", SourceReport, false}, {"a", SourceALS, true}}},
		{"distinct IDs", []report{{"a", SourceExtProc, false}, {"b", SourceALS, false}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newDedupe()
			for i, r := range tt.reports {
				if got := d.duplicate(r.id, r.source); got != r.dup {
					t.Errorf("report %d (%s from %s): duplicate = %v, want %v", i, r.id, r.source, got, r.dup)
				}
			}
		})
	}
}

// The memory is bounded: an ID whose pair never comes ages out after
// dedupeCapacity newer ones, and the map never holds more.
func TestDedupeBounded(t *testing.T) {
	d := newDedupe()
	d.duplicate("old", SourceExtProc)
	for i := range 2 * dedupeCapacity {
		d.duplicate(strconv.Itoa(i), SourceExtProc)
	}
	if n := len(d.claims); n > dedupeCapacity {
		t.Fatalf("%d claims held, capacity %d", n, dedupeCapacity)
	}
	if d.duplicate("old", SourceALS) {
		t.Error("an aged-out ID was still paired")
	}
}
