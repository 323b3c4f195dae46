package main

// The CUDA engine registers itself as "cuda" from its init.
import _ "github.com/kiln-lm/kiln/kernels"
