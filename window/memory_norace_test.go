//go:build !race

package window

// streamKeys is the number of distinct keys TestStoreBoundedMemory streams.
const streamKeys = 1_000_000
