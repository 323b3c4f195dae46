package model

import "golang.org/x/sys/cpu"

var hasAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA

//go:noescape
func expSumAVX2(dst, src *float32, n int, m float32) float64
