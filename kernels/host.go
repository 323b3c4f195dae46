package kernels

import (
	"fmt"

	"github.com/kiln-lm/kiln/kernels/cuda"
)

// Host is what a machine offers the CUDA engine: the driver's CUDA version,
// the libraries New loads, and the GPUs the driver sees.
type Host struct {
	Driver                 int // the CUDA version the driver runs: 13000 for 13.0
	DriverPath             string
	NVRTCMajor, NVRTCMinor int
	BLASLt                 uint64 // 130100 for 13.1.0
	GPUs                   []cuda.GPU
}

// ProbeHost makes New's checks short of opening a device: the driver and
// the libraries load, their versions agree, and GPU 0 has compute
// capability 8.0 or newer. It creates no context and takes no device
// memory, so a process that runs its engines elsewhere (the worker, whose
// tasks each run in a process of their own) can say what they will find.
// Its error is New's: an UnavailableError where engine auto takes the CPU.
// The Host holds what was read before the error.
func ProbeHost() (Host, error) {
	var h Host
	drv, nv, lt, err := loadLibraries()
	if drv != nil {
		h.DriverPath = drv.Path
		h.Driver, _ = drv.Version()
	}
	if nv != nil {
		h.NVRTCMajor, h.NVRTCMinor = nv.Major, nv.Minor
	}
	if lt != nil {
		h.BLASLt = lt.Version()
	}
	if err != nil {
		return h, err
	}
	n, err := drv.DeviceCount()
	if err != nil {
		return h, &cuda.UnavailableError{Err: err}
	}
	if n == 0 {
		return h, &cuda.UnavailableError{Err: fmt.Errorf("the CUDA driver (%s) sees no GPU: check nvidia-smi, and in a container that it was given the GPUs (docs/operations.md, \"The GPU worker's host\")", drv.Path)}
	}
	for i := range n {
		g, err := drv.Describe(i)
		if err != nil {
			return h, err
		}
		h.GPUs = append(h.GPUs, g)
	}
	g := h.GPUs[0]
	return h, checkCapability(g.Name, g.Major, g.Minor)
}

// loadLibraries loads the CUDA driver, NVRTC and cuBLASLt and checks that
// the driver runs the libraries' CUDA version; it returns what loaded.
func loadLibraries() (*cuda.Driver, *cuda.NVRTC, *cuda.BLASLt, error) {
	drv, err := cuda.LoadDriver()
	if err != nil {
		return nil, nil, nil, err
	}
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		return drv, nil, nil, err
	}
	lt, err := cuda.LoadBLASLt()
	if err != nil {
		return drv, nv, nil, err
	}
	return drv, nv, lt, cuda.CheckVersions(drv, nv, lt)
}

// Libraries names the driver's CUDA version and the libraries' versions,
// as one line: "driver CUDA 13.0, NVRTC 13.0, cuBLASLt 13.1.0".
func (h Host) Libraries() string {
	return fmt.Sprintf("driver CUDA %d.%d, NVRTC %d.%d, cuBLASLt %d.%d.%d", h.Driver/1000, h.Driver%1000/10,
		h.NVRTCMajor, h.NVRTCMinor, h.BLASLt/10000, h.BLASLt/100%100, h.BLASLt%100)
}

// DescribeGPU is one GPU as a line: "NVIDIA H200: compute 9.0, 132 SMs,
// 139.8 GiB".
func DescribeGPU(g cuda.GPU) string {
	return fmt.Sprintf("%s: compute %d.%d, %d SMs, %.1f GiB", g.Name, g.Major, g.Minor, g.SMs, float64(g.Total)/(1<<30))
}
