//go:build race

package model

// raceDetector: the race detector's instrumentation moves values to the
// heap, so allocation counts are not the engine's own.
const raceDetector = true
