//go:build race

package service

// raceDetector reports whether the tests run under -race, where sync.Pool
// drops some of what is put back and allocation counts mean nothing.
const raceDetector = true
