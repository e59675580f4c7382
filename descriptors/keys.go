package descriptors

import (
	"strconv"

	"github.com/leapgate/leapgate/window"
)

// setKeySuffixes sets the KeySuffix of every limit of rule: the window
// layout and, but for the default sliding window, the algorithm, plus the
// limit's index for a second limit with the same layout and algorithm.
// The suffix is persisted state on Redis (TestCounterKeysAreStable).
func setKeySuffixes(rule *Rule) {
	for i := range rule.Limits {
		l := &rule.Limits[i]
		l.KeySuffix = keySuffix(l.Spec, l.Algorithm, "")
		for _, prev := range rule.Limits[:i] {
			if prev.Spec == l.Spec && prev.Algorithm == l.Algorithm {
				l.KeySuffix = keySuffix(l.Spec, l.Algorithm, "#"+strconv.Itoa(i))
				break
			}
		}
	}
}

// keySuffix is a limit's KeySuffix: "\x00w", the window in ns, "/", the
// bucket count, "/" and the algorithm's name unless it is the sliding
// window, then extra.
func keySuffix(spec window.Spec, alg window.Algorithm, extra string) string {
	s := "\x00w" + strconv.FormatInt(int64(spec.Length()), 10) + "/" + strconv.Itoa(spec.Buckets())
	if alg != window.SlidingWindow {
		s += "/" + alg.String()
	}
	return s + extra
}
