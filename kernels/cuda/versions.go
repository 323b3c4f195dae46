package cuda

import "fmt"

// CheckVersions refuses CUDA libraries of a newer major version than the
// driver runs: a driver for CUDA 12 cannot load the modules NVRTC 13 makes
// nor run cuBLASLt 13, and without this check the failure would come later,
// from a module load or a first GEMM, in the driver's own words. The
// driver's version reads 12040 for 12.4, cuBLASLt's 130100 for 13.1.0. The error is an UnavailableError: "auto" falls back
// to the CPU, and an explicit cuda engine exits 2 with what to do.
func CheckVersions(d *Driver, nv *NVRTC, lt *BLASLt) error {
	v, err := d.Version()
	if err != nil {
		return err
	}
	return checkVersions(v, nv.Major, nv.Minor, nv.Path, int(lt.Version()), lt.Path)
}

func checkVersions(driver, nvMajor, nvMinor int, nvPath string, lt int, ltPath string) error {
	have := driver / 1000
	need, what := 0, ""
	switch {
	case nvMajor > have:
		need, what = nvMajor, fmt.Sprintf("NVRTC %d.%d (%s)", nvMajor, nvMinor, nvPath)
	case lt/10000 > have:
		need, what = lt/10000, fmt.Sprintf("cuBLASLt %d.%d (%s)", lt/10000, lt/100%100, ltPath)
	default:
		return nil
	}
	alt := ""
	if have >= 12 { // the oldest CUDA whose libraries kiln loads
		alt = fmt.Sprintf(", or give kiln CUDA %d libraries (CUDA_HOME or LD_LIBRARY_PATH, with no CUDA %d libraries on the loader's path)", have, need)
	}
	return &UnavailableError{Err: fmt.Errorf("the NVIDIA driver runs CUDA up to %d.%d, older than the CUDA %d libraries found, %s: "+
		"install a driver for CUDA %d (%s; nvidia-smi's header shows the CUDA version a driver runs)%s",
		have, driver%1000/10, need, what, need, driverFor(need), alt)}
}

// driverFor names the oldest Linux driver branch of a CUDA major version.
func driverFor(major int) string {
	switch major {
	case 12:
		return "525 or newer"
	case 13:
		return "580 or newer"
	}
	return "a current one"
}
