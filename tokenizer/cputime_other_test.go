//go:build !unix

package tokenizer

import (
	"testing"
	"time"
)

// reportCPUPerGB reports nothing where the process's CPU time is not read.
func reportCPUPerGB(*testing.B, time.Duration, int64) {}

func processCPU() time.Duration { return 0 }
