package main

import (
	"fmt"
	"io"

	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/kernels"
	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/trainer"
)

// checkGPU prints what engine auto trains on in this process's place: the
// GPUs, the CUDA driver and libraries, or why none starts. It fails where a
// worker here could not do what its settings ask: KILN_REQUIRE_GPU
// (require) with no GPU that starts, or KILN_GPUS (gpus) naming more GPUs
// than the driver sees, none among them: engine auto moves a run of one
// GPU to the CPU, never one of several (model.GPUsUnavailableError).
func checkGPU(w io.Writer, require bool, gpus trainer.GPUCount) error {
	h, perr := kernels.ProbeHost()
	for _, g := range h.GPUs {
		fmt.Fprintf(w, "%-37s %s\n", fmt.Sprintf("gpu %d", g.Ordinal), kernels.DescribeGPU(g))
	}
	if h.BLASLt != 0 {
		fmt.Fprintf(w, "%-37s %s\n", "cuda", h.Libraries())
	}
	switch {
	case perr != nil && require:
		fmt.Fprintf(w, "%-37s %s\n", "engine auto", "no GPU (KILN_REQUIRE_GPU: runs of engine auto are archived)")
		return badInput("KILN_REQUIRE_GPU is set and no GPU starts here (%s): this worker's runs of engine auto would be archived; "+
			"mend the host (docs/operations.md, \"The GPU worker's host\"), or unset KILN_REQUIRE_GPU to let them train on the CPU", noGPUWhy(perr))
	case perr != nil && severalGPUs(gpus):
		fmt.Fprintf(w, "%-37s %s\n", "engine auto", fmt.Sprintf("no GPU (KILN_GPUS %s: runs of engine auto are archived unless they name gpus 1): %s", gpus, noGPUWhy(perr)))
		return badInput("KILN_GPUS is %s and no GPU starts here (%s): this worker's runs of engine auto that name no gpus would be archived, "+
			"not moved to the CPU; set KILN_GPUS=1 to let them train on the CPU, or %s", gpus, noGPUWhy(perr), mendGPU(perr))
	case perr != nil:
		fmt.Fprintf(w, "%-37s %s\n", "engine auto", "the CPU: "+noGPUWhy(perr))
		return nil
	}
	fmt.Fprintf(w, "%-37s %s\n", "engine auto", "the GPU")
	if n := int(gpus); n != model.AllGPUs && n > len(h.GPUs) {
		return badInput("KILN_GPUS %d names more GPUs than the driver sees here (%d): reserve them for the container, or lower KILN_GPUS", n, len(h.GPUs))
	}
	return nil
}

// severalGPUs says whether the worker's KILN_GPUS asks for more than one
// GPU (all among them), which engine auto does not replace with the CPU.
func severalGPUs(gpus trainer.GPUCount) bool {
	return gpus > 1 || gpus == trainer.GPUCount(model.AllGPUs)
}

// mendGPU says what makes a GPU start where err says why none does.
func mendGPU(err error) string {
	if _, noDriver := model.Brief(err); noDriver {
		return "install the NVIDIA driver"
	}
	return "mend the host (docs/operations.md, \"The GPU worker's host\")"
}

// logGPU says at a GPU worker's start what its gpu tasks will train on, so
// that a host whose GPU does not start shows in the worker's log before a
// run is archived or trained on the CPU for it. The worker's own process
// only reads the devices: its tasks open them, each in a process of its
// own. gpus is the worker's KILN_GPUS.
func logGPU(log *zap.Logger, require bool, gpus trainer.GPUCount) {
	h, err := kernels.ProbeHost()
	switch {
	case err == nil:
		for _, g := range h.GPUs {
			log.Info("gpu", zap.Int("ordinal", g.Ordinal), zap.String("device", kernels.DescribeGPU(g)))
		}
		log.Info("cuda", zap.String("libraries", h.Libraries()))
	case require:
		log.Warn("this worker requires a GPU (KILN_REQUIRE_GPU) and none starts here: its gpu tasks of engine auto will be archived; "+
			"mend the host (docs/operations.md, \"The GPU worker's host\"), restart the worker, then sched retry them", zap.Error(err))
	case severalGPUs(gpus):
		log.Warn(fmt.Sprintf("no GPU starts here (%s) and KILN_GPUS is %s: gpu tasks of engine auto that name no gpus will be archived, not moved to the CPU, as those that name several; "+
			"set KILN_GPUS=1 to let them train on the CPU, or %s, and restart the worker", noGPUWhy(err), gpus, mendGPU(err)), zap.Error(err))
	default:
		log.Info("no GPU starts here: gpu tasks of engine auto train on the CPU (those that name several GPUs are archived)", zap.Error(err))
	}
}

// noGPUWhy says in one line why no GPU starts here, as ProbeHost found:
// on a machine without a driver, that alone, not every path tried.
func noGPUWhy(err error) string {
	why, _ := model.Brief(err)
	return why
}

// noGPUHere says why no GPU starts on this machine, "" where one does.
func noGPUHere() string {
	if _, err := kernels.ProbeHost(); err != nil {
		return noGPUWhy(err)
	}
	return ""
}

// checkCUDAEngine refuses --engine cuda where no GPU starts, before any
// work that would come first.
func checkCUDAEngine(engine string) error {
	if engine != "cuda" {
		return nil
	}
	if why := noGPUHere(); why != "" {
		return badInput("--engine cuda: %s; train on --engine cpu, or auto (the GPU where one starts)", why)
	}
	return nil
}
