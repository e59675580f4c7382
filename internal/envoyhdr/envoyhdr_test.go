package envoyhdr

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestProbeHeaderRoundTrip(t *testing.T) {
	ids := []uint64{1, 0xffff_ffff_ffff_ffff, 0xabc}
	if got := ParseProbes(FormatProbes(ids)); !slices.Equal(got, ids) {
		t.Errorf("ParseProbes(FormatProbes(%x)) = %x", ids, got)
	}
	if got := ParseProbes(" 1f , zz,0,,2"); !slices.Equal(got, []uint64{0x1f, 2}) {
		t.Errorf("ParseProbes skips junk and 0: got %x", got)
	}
	long := strings.Repeat("1,", 1000)
	if got := ParseProbes(long); len(got) != MaxProbeIDs {
		t.Errorf("ParseProbes of 1000 ids kept %d, want at most %d", len(got), MaxProbeIDs)
	}
}

// Retry-After never tells a client to come back early, nor at once.
func TestRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		wait time.Duration
		want int64
	}{{-time.Second, 1}, {0, 1}, {time.Nanosecond, 1}, {time.Second, 1}, {time.Second + 1, 2}, {90 * time.Second, 90}} {
		if got := RetryAfter(tc.wait); got != tc.want {
			t.Errorf("RetryAfter(%v) = %d, want %d", tc.wait, got, tc.want)
		}
	}
	if Seconds(0) != 0 || Seconds(-1) != 0 || Seconds(1500*time.Millisecond) != 2 {
		t.Error("Seconds")
	}
}
