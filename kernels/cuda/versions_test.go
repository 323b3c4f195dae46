package cuda

import (
	"errors"
	"strings"
	"testing"
)

// CUDA 13 libraries under a driver for CUDA 12 are refused before any
// module is loaded, as an engine that cannot run here, naming the library,
// both versions and the driver to install; libraries of the driver's major
// version or older pass.
func TestCheckVersionsRefusesLibrariesNewerThanTheDriver(t *testing.T) {
	nv, lt := "/usr/local/cuda/lib64/libnvrtc.so.13", "/usr/local/cuda/lib64/libcublasLt.so.13"
	err := checkVersions(12040, 13, 0, nv, 130100, lt)
	var un *UnavailableError
	if !errors.As(err, &un) || !un.Unavailable() || !un.BadInput() {
		t.Fatalf("NVRTC 13 under a CUDA 12.4 driver: %v, want an UnavailableError", err)
	}
	for _, want := range []string{"CUDA up to 12.4", "NVRTC 13.0 (" + nv + ")", "driver for CUDA 13 (580 or newer", "CUDA 12 libraries"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q: %v", want, err)
		}
	}
	// cuBLASLt alone newer than the driver (NVRTC 12 beside it).
	err = checkVersions(12080, 12, 8, "libnvrtc.so.12", 130100, lt)
	if !errors.As(err, &un) || !strings.Contains(err.Error(), "cuBLASLt 13.1 ("+lt+")") || !strings.Contains(err.Error(), "CUDA up to 12.8") {
		t.Errorf("cuBLASLt 13 under a CUDA 12.8 driver: %v", err)
	}
	// A driver older than any CUDA kiln loads: only the driver to install.
	err = checkVersions(11080, 13, 0, nv, 130100, lt)
	if err == nil || !strings.Contains(err.Error(), "CUDA up to 11.8") || strings.Contains(err.Error(), "CUDA 11 libraries") {
		t.Errorf("NVRTC 13 under a CUDA 11.8 driver: %v; want the driver named and no CUDA 11 libraries offered", err)
	}
	for _, c := range []struct {
		driver, nv, lt int
	}{{13000, 13, 130000}, {13010, 13, 130100}, {13000, 12, 120805}, {12080, 12, 120805}, {12040, 12, 120900}} {
		if err := checkVersions(c.driver, c.nv, 0, "nvrtc", c.lt, "lt"); err != nil {
			t.Errorf("driver %d, NVRTC %d, cuBLASLt %d: %v, want none", c.driver, c.nv, c.lt, err)
		}
	}
}
