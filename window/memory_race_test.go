//go:build race

package window

// streamKeys is the number of distinct keys TestStoreBoundedMemory streams;
// fewer under the race detector, which slows the stream tenfold.
const streamKeys = 100_000
